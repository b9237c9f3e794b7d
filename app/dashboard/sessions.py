"""Dashboard sign-in: portal links and API keys become a signed session cookie.

The cookie is ``HttpOnly; Secure; SameSite=Lax`` and holds a signed session (who, until when,
and its own id). ``SessionCookieMiddleware`` turns it into ``request.state.principal``, which
the API's own ``current_principal`` honours, so the pages and the JSON API they fetch see the
same caller. Signing out records the session's id (``app.auth``'s signed-out sessions), so a
copy of the cookie stops working too.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from app.auth.models import KeyKind
from app.auth.service import Principal, key_active, session_signed_out, sign_out_session
from app.core.db import transaction
from app.core.limits import send_unavailable
from app.customers.service import portal_revoked_at
from app.dashboard.tokens import Purpose, sign, verify
from app.settings import get_settings

COOKIE_NAME = "gpumeter_session"
SESSION_TTL_S = 12 * 3600
PORTAL_LINK_TTL_S = 7 * 86_400
# A cookie is ambient authority: the middleware honours it on reads only, so no other site can
# make a signed-in browser change anything through the API (POSTs need an explicit API key);
# the dashboard's own budget forms read it themselves, behind the same-origin check.
_COOKIE_METHODS = frozenset({"GET", "HEAD"})


@dataclass(frozen=True)
class PortalLink:
    token: str
    expires_at: int


def portal_link(customer_id: uuid.UUID, ttl_s: int = PORTAL_LINK_TTL_S) -> PortalLink:
    expires_at = int(time.time()) + ttl_s
    claims = {"cid": str(customer_id), "lid": str(uuid.uuid4()), "iat": time.time()}
    return PortalLink(sign(_secret(), Purpose.PORTAL, claims, expires_at), expires_at)


def link_customer(token: str) -> uuid.UUID | None:
    """The customer a genuine, unexpired portal link signs in to."""
    claims = verify(_secret(), Purpose.PORTAL, token)
    return None if claims is None else uuid.UUID(claims["cid"])


def session_from_portal(token: str, engine: Engine) -> str | None:
    """A session token for a genuine, unexpired, unrevoked portal link; None otherwise.

    The session ends when the link would have (or after SESSION_TTL_S, whichever is first) and
    keeps the link's issue time, so revoking the customer's links ends it too."""
    claims = verify(_secret(), Purpose.PORTAL, token)
    if claims is None:
        return None
    with transaction(engine) as session:
        if _revoked(session, uuid.UUID(claims["cid"]), claims.get("iat", 0.0)):
            return None
    # The link's own id stands in for a key id: it tells sessions from different links apart.
    expires_at = min(claims["exp"], int(time.time()) + SESSION_TTL_S)
    return _session(
        KeyKind.CUSTOMER,
        claims["lid"],
        claims["cid"],
        key_backed=False,
        issued_at=claims.get("iat", 0.0),
        expires_at=expires_at,
    )


def session_from_key(principal: Principal) -> str:
    """A session for an API key: checked against revocation on every request."""
    customer = None if principal.customer_id is None else str(principal.customer_id)
    now = time.time()
    return _session(
        principal.kind,
        str(principal.key_id),
        customer,
        key_backed=True,
        issued_at=now,
        expires_at=int(now) + SESSION_TTL_S,
    )


def _session(
    kind: KeyKind,
    key_id: str,
    customer_id: str | None,
    *,
    key_backed: bool,
    issued_at: float,
    expires_at: int,
) -> str:
    claims = {
        "sid": str(uuid.uuid4()),
        "kind": kind.value,
        "kid": key_id,
        "cid": customer_id,
        "key": key_backed,
        "iat": issued_at,
    }
    return sign(_secret(), Purpose.SESSION, claims, expires_at)


def session_claims(request: Request) -> dict[str, Any] | None:
    """The claims of the request's genuine, unexpired session cookie (not yet checked against
    sign-outs and revocations: ``principal_from_claims`` does that)."""
    token = request.cookies.get(COOKIE_NAME)
    return None if token is None else verify(_secret(), Purpose.SESSION, token)


def sign_out(claims: dict[str, Any], engine: Engine) -> None:
    """End the session on the server (a copy of its cookie is refused from now on)."""
    with transaction(engine) as session:
        sign_out_session(session, uuid.UUID(claims["sid"]), claims["exp"])


def set_session_cookie(response: Response, session_token: str) -> None:
    response.set_cookie(
        COOKIE_NAME,
        session_token,
        max_age=SESSION_TTL_S,
        path="/",
        secure=True,
        httponly=True,
        samesite="lax",
    )


def clear_session_cookie(response: Response) -> None:
    response.delete_cookie(COOKIE_NAME, path="/", secure=True, httponly=True, samesite="lax")


# The keys that open a dashboard session: a node's token or a scheduler adapter's key is a
# machine's, valid on its own API routes only.
PEOPLE = frozenset({KeyKind.ADMIN, KeyKind.CUSTOMER})


def principal_from_claims(claims: dict[str, Any], engine: Engine) -> Principal | None:
    """The session's principal; None once signed out of, or its key or the customer's portal
    access revoked (a cookie from before sessions had ids is refused: sign in again)."""
    kind = KeyKind(claims["kind"])
    if kind not in PEOPLE or "sid" not in claims:
        return None
    key_id = uuid.UUID(claims["kid"])
    customer = None if claims["cid"] is None else uuid.UUID(claims["cid"])
    with transaction(engine) as session:
        if session_signed_out(session, uuid.UUID(claims["sid"])):
            return None
        if claims["key"] and not key_active(session, key_id):
            return None
        if customer is not None and _revoked(session, customer, claims.get("iat", 0.0)):
            return None
    return Principal(key_id, kind, customer)


def _revoked(session: Session, customer_id: uuid.UUID, issued_at: float) -> bool:
    """Whether an admin revoked the customer's sessions and links at or after ``issued_at``."""
    revoked_at = portal_revoked_at(session, customer_id)
    return revoked_at is not None and issued_at <= revoked_at.timestamp()


def _secret() -> str:
    secret = get_settings().secret_key
    if not secret:  # `gpumeter serve` never starts without one; an embedding caller must set it
        raise RuntimeError("GPUMETER_SECRET_KEY is not set: nothing to sign sessions with")
    return secret


class SessionCookieMiddleware:
    """Sets ``request.state.principal`` from a valid session cookie on safe requests that carry
    no ``Authorization`` header (an explicit key always wins)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] in _COOKIE_METHODS:
            request = Request(scope)
            if "authorization" not in request.headers:
                claims = session_claims(request)
                if claims is not None:
                    engine = request.app.state.engine
                    try:
                        principal = await run_in_threadpool(principal_from_claims, claims, engine)
                    except (OperationalError, PoolTimeout):
                        await send_unavailable(send, "the database is unavailable; retry later")
                        return
                    if principal is not None:
                        scope.setdefault("state", {})["principal"] = principal
        await self.app(scope, receive, send)
