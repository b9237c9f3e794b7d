"""Failed authentication is throttled per client address and per key (429 with Retry-After),
in bounded memory; a valid key is never refused because of other keys' failures."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import Engine
from sqlalchemy.exc import OperationalError
from starlette.types import Receive, Scope, Send

from app.auth.throttle import FailedAuthThrottle, ThrottleFailedAuth
from app.main import create_app
from app.settings import get_settings
from tests.e2e.conftest import Service
from tests.harness import Console, bearer

LIMIT = 3


@pytest.fixture
def throttled(db: Engine, monkeypatch: pytest.MonkeyPatch) -> Iterator[FastAPI]:
    monkeypatch.setenv("GPUMETER_AUTH_FAILURES_PER_WINDOW", str(LIMIT))
    monkeypatch.setenv("GPUMETER_AUTH_FAILURE_WINDOW_S", "60")
    get_settings.cache_clear()
    yield create_app(db, worker=False)
    get_settings.cache_clear()


def guess(prefix: str = "gm_customer_") -> str:
    return prefix + secrets.token_urlsafe(32)


def customer_key(client: TestClient, admin_key: str) -> str:
    console = Console(client, admin_key)
    customer = console.customer()
    issued: str = console.post(f"/v1/customers/{customer['id']}/keys", {"name": "ci"})["key"]
    return issued


def test_no_number_of_bad_customer_keys_refuses_a_valid_one(
    throttled: FastAPI, admin_key: str
) -> None:
    # Every customer key begins `gm_customer_`: failures once counted per 12-character prefix,
    # so twenty bad keys from anywhere locked every tenant out, dashboard sign-in included.
    with TestClient(throttled, client=("198.51.100.1", 4000)) as tenant:
        valid = customer_key(tenant, admin_key)
    for n in range(4 * LIMIT):
        with TestClient(throttled, client=(f"192.0.2.{n}", 4000)) as client:
            assert client.get("/v1/invoices", headers=bearer(guess())).status_code == 401
    with TestClient(throttled, client=("198.51.100.1", 4000), follow_redirects=False) as tenant:
        assert tenant.get("/v1/invoices", headers=bearer(valid)).status_code == 200
        signed_in = tenant.post("/dashboard/sign-in", data={"api_key": valid, "next": "/dashboard"})
        assert (signed_in.status_code, signed_in.headers["location"]) == (303, "/dashboard")


def test_a_throttled_address_gets_429_for_bad_keys_and_is_served_for_valid_ones(
    throttled: FastAPI, admin_key: str
) -> None:
    # One address many clients share (a NAT): one client's failures must not refuse another's key.
    with TestClient(throttled, client=("203.0.113.7", 4000), follow_redirects=False) as shared:
        valid = customer_key(shared, admin_key)
        statuses = [shared.get("/v1/invoices", headers=bearer(guess())).status_code]
        statuses += [shared.get("/v1/invoices", headers=bearer(guess())).status_code]
        statuses += [shared.get("/v1/invoices", headers=bearer(guess())).status_code]
        assert statuses == [401] * LIMIT
        blocked = shared.get("/v1/invoices", headers=bearer(guess()))
        assert blocked.status_code == 429, blocked.text
        assert 59 <= int(blocked.headers["retry-after"]) <= 60
        assert blocked.json()["detail"][0]["loc"] == ["header", "authorization"]
        assert shared.post("/dashboard/sign-in", data={"api_key": guess()}).status_code == 429
        assert shared.get("/v1/invoices", headers=bearer(valid)).status_code == 200
        assert shared.get("/v1/customers", headers=bearer(admin_key)).status_code == 200
        signed_in = shared.post("/dashboard/sign-in", data={"api_key": valid, "next": "/dashboard"})
        assert (signed_in.status_code, signed_in.headers["location"]) == (303, "/dashboard")
    with TestClient(throttled, client=("198.51.100.1", 4000)) as other:
        assert other.get("/v1/invoices", headers=bearer(guess())).status_code == 401


def test_a_revoked_key_retried_is_refused_from_any_address_and_only_it(
    throttled: FastAPI, admin_key: str
) -> None:
    with TestClient(throttled, client=("198.51.100.2", 4000)) as client:
        console = Console(client, admin_key)
        customer = console.customer()
        old = console.post(f"/v1/customers/{customer['id']}/keys", {"name": "old"})
        new = console.post(f"/v1/customers/{customer['id']}/keys", {"name": "new"})
        console.post(f"/v1/keys/{old['id']}/revoke", {}, status=200)
    for n in range(LIMIT):  # a script retrying the revoked key, its address changing
        with TestClient(throttled, client=(f"192.0.2.{n}", 4000)) as script:
            assert script.get("/v1/invoices", headers=bearer(old["key"])).status_code == 401
    with TestClient(throttled, client=("192.0.2.99", 4000)) as script:
        assert script.get("/v1/invoices", headers=bearer(old["key"])).status_code == 429
        assert script.get("/v1/invoices", headers=bearer(new["key"])).status_code == 200
        assert script.get("/v1/invoices", headers=bearer(guess())).status_code == 401


def test_sign_in_form_failures_count_too(throttled: FastAPI, admin_key: str) -> None:
    with TestClient(throttled, client=("203.0.113.8", 4000), follow_redirects=False) as browser:
        for _ in range(LIMIT):
            wrong = browser.post("/dashboard/sign-in", data={"api_key": guess()})
            assert wrong.status_code == 303 and "error=invalid" in wrong.headers["location"]
        assert browser.post("/dashboard/sign-in", data={"api_key": guess()}).status_code == 429
        assert browser.get("/v1/customers", headers=bearer(guess())).status_code == 429
        assert browser.get("/v1/customers", headers=bearer(admin_key)).status_code == 200


def test_memory_is_bounded_and_windows_end() -> None:
    now = [0.0]
    throttle = FailedAuthThrottle(limit=1, window_s=60, tracked=100, clock=lambda: now[0])
    for n in range(10_000):  # a flood of addresses and keys
        throttle.failed(f"10.0.{n // 256}.{n % 256}", f"gm_{n:09d}")
    assert [len(table) for table in throttle._windows.values()] == [100, 100]
    assert throttle.address_throttled("10.0.39.15") == 60  # the latest are kept
    assert throttle.key_refused(f"gm_{9_999:09d}") == 60
    assert throttle.address_throttled("10.0.0.0") is None  # the oldest forgotten
    now[0] = 60.0
    assert throttle.address_throttled("10.0.39.15") is None
    assert throttle.key_refused(f"gm_{9_999:09d}") is None


def test_behind_a_trusted_proxy_each_client_is_throttled_by_its_forwarded_address(
    db: Engine, database_url: str, admin_key: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A real `gpumeter serve`: uvicorn takes the client's address from the proxy's header.
    monkeypatch.setenv("GPUMETER_AUTH_FAILURES_PER_WINDOW", str(LIMIT))
    monkeypatch.setenv("GPUMETER_FORWARDED_ALLOW_IPS", "127.0.0.1")
    service = Service(database_url, tmp_path)
    service.start()
    try:

        def status(client: str, key: str) -> int:
            headers = {**bearer(key), "X-Forwarded-For": client}
            return httpx.get(service.url + "/v1/customers", headers=headers, timeout=10).status_code

        assert [status("203.0.113.7", guess("gm_admin_")) for _ in range(LIMIT)] == [401] * LIMIT
        assert status("203.0.113.7", guess("gm_admin_")) == 429
        assert status("198.51.100.1", guess("gm_admin_")) == 401  # another client behind it
        assert status("203.0.113.7", admin_key) == 200
    finally:
        service.stop()


def test_a_database_outage_while_checking_a_key_is_a_503_not_a_500() -> None:
    # From a throttled address a key is looked up before the app runs; the database being
    # unreachable then is the service's state, not the request's fault: 503, retry later.
    async def unreachable(key: str) -> bool:
        raise OperationalError("SELECT 1", {}, Exception("connection refused"))

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        raise AssertionError("a throttled request with an unchecked key reached the app")

    throttle = FailedAuthThrottle(limit=1, window_s=60, tracked=10)
    throttle.failed("testclient", guess())
    client = TestClient(ThrottleFailedAuth(app, throttle, unreachable))  # no lifespan to run
    answer = client.get("/v1/invoices", headers=bearer(guess()))
    assert answer.status_code == 503, answer.text
    assert answer.headers["retry-after"] and answer.json()["detail"][0]["msg"]
