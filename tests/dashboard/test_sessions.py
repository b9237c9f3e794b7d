"""Session security: no default secret, sessions bounded by their link, admin revocation."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from app.auth.models import KeyKind
from app.core.db import transaction
from app.dashboard import sessions, tokens
from app.settings import get_settings
from tests.dashboard.test_pages import portal_link, sign_in_with_link
from tests.harness import Console, bearer


def cookie(token: str) -> dict[str, str]:
    return {"Cookie": f"{sessions.COOKIE_NAME}={token}"}


def test_a_cookie_signed_with_the_old_default_secret_is_refused(
    client: TestClient, console: Console
) -> None:
    admin_id = console.client.get("/v1/keys", headers=console.headers).json()["items"][0]["id"]
    claims = {
        "sid": str(uuid.uuid4()),
        "kind": KeyKind.ADMIN.value,
        "kid": admin_id,
        "cid": None,
        "key": True,
        "iat": 0,
    }
    expires_at = int(time.time()) + 3600
    forged = tokens.sign("change-me-in-production", tokens.Purpose.SESSION, claims, expires_at)
    genuine = tokens.sign(
        get_settings().secret_key or "", tokens.Purpose.SESSION, claims, expires_at
    )
    assert client.get("/v1/customers", headers=cookie(forged)).status_code == 401
    assert client.get("/v1/customers", headers=cookie(genuine)).status_code == 200  # the control


def test_a_portal_session_ends_when_its_link_would_have(
    client: TestClient, console: Console
) -> None:
    customer = console.customer()
    url = console.post(f"/v1/customers/{customer['id']}/portal-links", {"ttl_s": 60})["url"]
    response = client.get(url, follow_redirects=False)
    claims = tokens.verify(
        get_settings().secret_key or "",
        tokens.Purpose.SESSION,
        response.cookies["gpumeter_session"],
    )
    link = tokens.verify(
        get_settings().secret_key or "", tokens.Purpose.PORTAL, url.rsplit("/")[-1]
    )
    assert claims is not None and link is not None
    assert claims["exp"] == link["exp"]  # 60 s, not the 12 h a session otherwise lasts


def test_an_admin_revokes_a_customers_links_and_sessions(
    client: TestClient, console: Console
) -> None:
    customer = console.customer()
    path = f"/v1/customers/{customer['id']}"
    old_link = portal_link(console, customer["id"])
    sign_in_with_link(client, portal_link(console, customer["id"]))
    assert client.get(path).status_code == 200

    revoked = console.post(f"{path}/portal-links/revoke", {}, status=200)
    assert revoked["revoked_at"]
    assert client.get(path).status_code == 401  # the signed-in session ended
    assert client.get(old_link, follow_redirects=False).status_code == 401  # the link too
    client.cookies.clear()
    sign_in_with_link(client, portal_link(console, customer["id"]))  # a new link works
    assert client.get(path).status_code == 200


def test_revoking_one_customer_leaves_the_others_signed_in(
    client: TestClient, console: Console
) -> None:
    acme, other = console.customer("Acme"), console.customer("Other")
    sign_in_with_link(client, portal_link(console, acme["id"]))
    console.post(f"/v1/customers/{other['id']}/portal-links/revoke", {}, status=200)
    assert client.get(f"/v1/customers/{acme['id']}").status_code == 200


@pytest.fixture
def setenv(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str, str], None]]:
    """Sets a GPUMETER_ variable for the test; the settings are read again on either side."""

    def set_(name: str, value: str) -> None:
        monkeypatch.setenv(name, value)
        get_settings.cache_clear()

    yield set_
    monkeypatch.undo()
    get_settings.cache_clear()


def test_a_copied_cookie_stops_working_after_sign_out(
    client: TestClient, console: Console, db: Engine
) -> None:
    acme, other = console.customer("Acme"), console.customer("Other")
    sign_in_with_link(client, portal_link(console, acme["id"]))
    copied = client.cookies[sessions.COOKIE_NAME]
    # Another browser, signed in with a link of the same customer.
    with TestClient(client.app, base_url=str(client.base_url)) as elsewhere:
        sign_in_with_link(elsewhere, portal_link(console, acme["id"]))
        out = client.post("/dashboard/sign-out", follow_redirects=False)
        assert out.status_code == 303 and out.headers["location"] == "/dashboard/sign-in"
        assert client.get(f"/v1/customers/{acme['id']}", headers=cookie(copied)).status_code == 401
        assert elsewhere.get(f"/v1/customers/{acme['id']}").status_code == 200  # its own session
    # Another customer's session is untouched; the table keeps only unexpired sign-outs.
    client.cookies.clear()
    sign_in_with_link(client, portal_link(console, other["id"]))
    assert client.get(f"/v1/customers/{other['id']}").status_code == 200
    stale = uuid.uuid4()
    with transaction(db) as session:
        session.execute(
            text("INSERT INTO signed_out_sessions VALUES (:id, :at)"),
            {"id": stale, "at": datetime(2026, 1, 1, tzinfo=UTC)},
        )
    assert client.post("/dashboard/sign-out", follow_redirects=False).status_code == 303
    with transaction(db) as session:
        kept = session.scalars(text("SELECT session_id FROM signed_out_sessions")).all()
    assert len(kept) == 2 and stale not in kept  # Acme's and Other's, not the expired one


def test_a_portal_link_asks_before_it_replaces_another_customers_session(
    client: TestClient, console: Console
) -> None:
    acme, other = console.customer("Acme"), console.customer("Evil Corp")
    sign_in_with_link(client, portal_link(console, acme["id"]))
    mine = client.cookies[sessions.COOKIE_NAME]
    # Another site sends the browser a link to its own customer's dashboard.
    planted = portal_link(console, other["id"])
    asked = client.get(planted, headers={"Sec-Fetch-Site": "cross-site"}, follow_redirects=False)
    assert asked.status_code == 200 and "set-cookie" not in asked.headers
    assert "Switch dashboards?" in asked.text and "Evil Corp" in asked.text and "Acme" in asked.text
    assert client.get(f"/v1/customers/{acme['id']}").status_code == 200  # still Acme
    # A form from another site cannot confirm it; the dashboard's own can.
    forged = client.post(planted, headers={"Origin": "https://evil.example"})
    assert forged.status_code == 403
    switched = client.post(
        planted, headers={"Origin": "https://testserver"}, follow_redirects=False
    )
    assert switched.status_code == 303 and sessions.COOKIE_NAME in switched.headers["set-cookie"]
    assert client.get(f"/v1/customers/{other['id']}").status_code == 200
    # The replaced session was ended, not only forgotten by this browser.
    assert client.get(f"/v1/customers/{acme['id']}", headers=cookie(mine)).status_code == 401
    # Opening a link of the customer already signed in to asks nothing.
    again = client.get(portal_link(console, other["id"]), follow_redirects=False)
    assert again.status_code == 303


def test_the_host_header_is_never_reflected(
    client: TestClient, console: Console, setenv: Callable[[str, str], None]
) -> None:
    customer = console.customer()
    evil = {"Host": "evil.example"}
    path = f"/v1/customers/{customer['id']}/portal-links"
    url = client.post(path, json={}, headers={**console.headers, **evil}).json()["url"]
    assert url.startswith("/dashboard/portal/")
    setenv("GPUMETER_PUBLIC_URL", "https://meter.example.com/")
    url = client.post(path, json={}, headers={**console.headers, **evil}).json()["url"]
    assert url.startswith("https://meter.example.com/dashboard/portal/")
    signed_out = client.get("/dashboard/costs?period=2026-10", headers=evil, follow_redirects=False)
    assert (
        signed_out.headers["location"]
        == "/dashboard/sign-in?next=%2Fdashboard%2Fcosts%3Fperiod%3D2026-10"
    )
    page = client.get("/dashboard/sign-in", headers=evil)
    assert page.status_code == 200 and "evil.example" not in page.text
    refused = client.post("/dashboard/sign-out", headers={**evil, "Origin": "https://x.example"})
    assert refused.status_code == 403 and "example" not in refused.text


def test_behind_a_proxy_that_rewrites_host_the_public_url_is_this_sites_origin(
    client: TestClient, console: Console, setenv: Callable[[str, str], None]
) -> None:
    """A proxy that forwards to the service's own address (Host: gpumeter:8000) still lets the
    site's own forms post when GPUMETER_PUBLIC_URL names the address browsers use; another
    site, or the same host under another scheme, is still refused."""
    customer = console.customer()
    site = "https://meter.example.com"  # where the portal link signs in (a Secure cookie)
    proxied = {"Host": "gpumeter:8000"}
    setenv("GPUMETER_PUBLIC_URL", "https://meter.example.com/")
    for origin in ("https://evil.example", "http://meter.example.com"):
        sign_in_with_link(client, portal_link(console, customer["id"]))
        refused = client.post(f"{site}/dashboard/sign-out", headers={**proxied, "Origin": origin})
        assert refused.status_code == 403
        assert client.get(f"{site}/v1/customers/{customer['id']}").status_code == 200  # still in
    own = {**proxied, "Origin": "https://meter.example.com"}
    signed_out = client.post(f"{site}/dashboard/sign-out", headers=own, follow_redirects=False)
    assert signed_out.status_code == 303
    assert client.get(f"{site}/v1/customers/{customer['id']}").status_code == 401


def test_metrics_take_an_admin_key_unless_opened(
    client: TestClient, console: Console, setenv: Callable[[str, str], None]
) -> None:
    customer = console.customer()
    key = console.post(f"/v1/customers/{customer['id']}/keys", {"name": "ci"})["key"]
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers=bearer(key)).status_code == 403
    sign_in_with_link(client, portal_link(console, customer["id"]))
    assert client.get("/metrics").status_code == 403  # a customer's session neither
    client.cookies.clear()
    scraped = client.get("/metrics", headers=console.headers)
    assert scraped.status_code == 200 and "gpumeter_queue_jobs" in scraped.text
    setenv("GPUMETER_METRICS_PUBLIC", "true")
    assert client.get("/metrics").status_code == 200
