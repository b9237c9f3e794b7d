"""Webhook fixtures: settings for 127.0.0.1 receivers and fast retries, a real receiver."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from app.main import create_app
from app.settings import Settings, get_settings
from tests.harness import Console
from tests.webhooks.receiver import Receiver, running

# Tests deliver to 127.0.0.1, which only this setting allows; retries come quickly.
FAST_RETRIES = {
    "GPUMETER_WEBHOOK_ALLOW_PRIVATE": "true",
    "GPUMETER_WEBHOOK_RETRY_BASE_S": "0.2",
    "GPUMETER_WEBHOOK_RETRY_MAX_S": "1",
    "GPUMETER_WEBHOOK_TIMEOUT_S": "5",
}


@pytest.fixture
def settings(monkeypatch: pytest.MonkeyPatch) -> Iterator[Settings]:
    for name, value in FAST_RETRIES.items():
        monkeypatch.setenv(name, value)
    get_settings.cache_clear()
    yield get_settings()
    get_settings.cache_clear()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with running(Receiver()) as server:
        yield server


def register(console: Console, receiver: Receiver, path: str, **fields: Any) -> dict[str, Any]:
    """An endpoint at ``receiver``'s ``path``; the receiver learns its secret."""
    endpoint = console.post("/v1/webhooks/endpoints", {"url": receiver.url(path), **fields})
    receiver.secrets[path] = endpoint["secret"]
    return endpoint


@pytest.fixture
def worker(settings: Settings, db: Engine) -> Iterator[None]:
    """A real queue worker (the service's in-process one) while the test runs."""
    with TestClient(create_app(db, worker=True)):
        yield
