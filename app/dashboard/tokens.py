"""Signed, expiring tokens for portal links and dashboard sessions (HMAC-SHA256, stateless).

A token is ``base64url(json payload) "." base64url(mac)``. The MAC covers the purpose too, so
a portal link can never be replayed as a session cookie or the other way round.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from enum import StrEnum
from typing import Any


class Purpose(StrEnum):
    PORTAL = "portal"  # a link an admin hands to a customer
    SESSION = "session"  # the dashboard's cookie


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(secret: str, purpose: Purpose, body: str) -> str:
    digest = hmac.new(secret.encode(), f"{purpose}.{body}".encode(), hashlib.sha256).digest()
    return _b64(digest)


def sign(secret: str, purpose: Purpose, claims: dict[str, Any], expires_at: int) -> str:
    body = _b64(json.dumps({**claims, "exp": expires_at}, separators=(",", ":")).encode())
    return f"{body}.{_mac(secret, purpose, body)}"


def verify(
    secret: str, purpose: Purpose, token: str, now: float | None = None
) -> dict[str, Any] | None:
    """The claims of a genuine, unexpired token; None for anything else."""
    body, _, mac = token.partition(".")
    if not mac or not hmac.compare_digest(mac, _mac(secret, purpose, body)):
        return None
    try:
        claims = json.loads(_unb64(body))
    except ValueError:
        return None
    expires_at = claims.get("exp") if isinstance(claims, dict) else None
    if not isinstance(expires_at, int) or expires_at <= (time.time() if now is None else now):
        return None
    return claims
