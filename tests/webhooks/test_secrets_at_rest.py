"""Webhook signing secrets are stored encrypted (Fernet, keys from settings); a new key put
first keeps the old secrets readable and encrypts what is written next (rotation is adding a
key)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from cryptography.fernet import Fernet
from sqlalchemy import Engine, text

from app.core.db import transaction
from app.settings import Settings, get_settings
from app.webhooks.models import WebhookEndpoint
from tests.harness import Console

OLD, NEW = Fernet.generate_key().decode(), Fernet.generate_key().decode()


@pytest.fixture
def keys(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("GPUMETER_ENCRYPTION_KEYS", f'["{OLD}"]')
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


def stored(db: Engine, endpoint_id: str) -> str:
    with db.connect() as connection:
        query = text("SELECT secret FROM webhook_endpoints WHERE id = :i")
        return str(connection.scalar(query, {"i": endpoint_id}))


@pytest.mark.usefixtures("keys")
def test_secrets_are_encrypted_at_rest_and_a_new_key_keeps_them_readable(
    console: Console, db: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoint = console.post("/v1/webhooks/endpoints", {"url": "http://127.0.0.1:9/hook"})
    secret = endpoint["secret"]
    at_rest = stored(db, endpoint["id"])
    assert secret.startswith("whsec_") and secret not in at_rest
    assert Fernet(OLD).decrypt(at_rest.encode()).decode() == secret

    monkeypatch.setenv("GPUMETER_ENCRYPTION_KEYS", f'["{NEW}", "{OLD}"]')  # a new key first
    get_settings.cache_clear()
    with transaction(db) as session:
        assert session.get_one(WebhookEndpoint, endpoint["id"]).secret == secret
    rotated = console.post(f"/v1/webhooks/endpoints/{endpoint['id']}/secret", {}, status=200)
    assert Fernet(NEW).decrypt(stored(db, endpoint["id"]).encode()).decode() == rotated["secret"]
