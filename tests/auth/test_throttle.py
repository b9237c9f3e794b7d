"""Failed authentication is throttled per client address and per key prefix (429 with
Retry-After, before any lookup), in bounded memory."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from app.auth.throttle import FailedAuthThrottle
from app.main import create_app
from app.settings import get_settings
from tests.harness import bearer

LIMIT = 3


@pytest.fixture
def throttled(db: Engine, monkeypatch: pytest.MonkeyPatch) -> Iterator[FastAPI]:
    monkeypatch.setenv("GPUMETER_AUTH_FAILURES_PER_WINDOW", str(LIMIT))
    monkeypatch.setenv("GPUMETER_AUTH_FAILURE_WINDOW_S", "60")
    get_settings.cache_clear()
    yield create_app(db, worker=False)
    get_settings.cache_clear()


def guess() -> str:
    return "gm_" + secrets.token_urlsafe(24)


def test_failures_from_one_address_are_throttled_valid_keys_too(
    throttled: FastAPI, admin_key: str
) -> None:
    with TestClient(throttled, client=("203.0.113.7", 4000)) as guesser:
        statuses = [guesser.get("/v1/customers", headers=bearer(guess())).status_code]
        statuses += [guesser.get("/v1/customers", headers=bearer(guess())).status_code]
        statuses += [guesser.get("/v1/customers", headers=bearer(guess())).status_code]
        assert statuses == [401] * LIMIT
        blocked = guesser.get("/v1/customers", headers=bearer(admin_key))
        assert blocked.status_code == 429, blocked.text
        assert 59 <= int(blocked.headers["retry-after"]) <= 60
        assert blocked.json()["detail"][0]["loc"] == ["header", "authorization"]
        form = {"api_key": admin_key, "next": "/dashboard"}
        assert guesser.post("/dashboard/sign-in", data=form).status_code == 429
    with TestClient(throttled, client=("198.51.100.1", 4000)) as other:
        assert other.get("/v1/customers", headers=bearer(admin_key)).status_code == 200


def test_failures_for_one_key_prefix_are_throttled_from_any_address(
    throttled: FastAPI, admin_key: str
) -> None:
    prefix = admin_key[:12]
    for n in range(LIMIT):  # a distributed guesser aiming at one key
        with TestClient(throttled, client=(f"192.0.2.{n}", 4000)) as client:
            wrong = prefix + secrets.token_urlsafe(24)
            assert client.get("/v1/customers", headers=bearer(wrong)).status_code == 401
    with TestClient(throttled, client=("192.0.2.99", 4000)) as client:
        assert client.get("/v1/customers", headers=bearer(admin_key)).status_code == 429


def test_sign_in_form_failures_count_too(throttled: FastAPI, admin_key: str) -> None:
    with TestClient(throttled, client=("203.0.113.8", 4000), follow_redirects=False) as browser:
        for _ in range(LIMIT):
            wrong = browser.post("/dashboard/sign-in", data={"api_key": guess()})
            assert wrong.status_code == 303 and "error=invalid" in wrong.headers["location"]
        blocked = browser.post("/dashboard/sign-in", data={"api_key": admin_key})
        assert blocked.status_code == 429
        assert browser.get("/v1/customers", headers=bearer(admin_key)).status_code == 429


def test_memory_is_bounded_and_windows_end() -> None:
    now = [0.0]
    throttle = FailedAuthThrottle(limit=1, window_s=60, tracked=100, clock=lambda: now[0])
    for n in range(10_000):  # a flood of addresses and prefixes
        throttle.failed(f"10.0.{n // 256}.{n % 256}", f"gm_{n:09d}")
    assert [len(table) for table in throttle._windows.values()] == [100, 100]
    assert throttle.retry_after("10.0.39.15", "gm_other") == 60  # the latest are kept
    now[0] = 60.0
    assert throttle.retry_after("10.0.39.15", "gm_other") is None
