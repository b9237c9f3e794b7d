"""Standard Webhooks signatures (the ``standardwebhooks`` library): secrets and headers."""

from __future__ import annotations

import base64
import secrets
from datetime import datetime

from standardwebhooks import Webhook

SECRET_PREFIX = "whsec_"


def new_secret() -> str:
    """A 256-bit secret in the spec's ``whsec_<base64>`` form."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def headers(message_id: str, at: datetime, body: str, secrets_: list[str]) -> dict[str, str]:
    """The three Standard Webhooks headers; one ``v1`` signature per secret (during a rotation
    the previous secret signs too, space-separated, as the spec allows)."""
    signatures = [Webhook(secret).sign(message_id, at, body) for secret in secrets_]
    return {
        "webhook-id": message_id,
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": " ".join(signatures),
        "content-type": "application/json",
        "user-agent": "gpumeter-webhooks/1",
    }
