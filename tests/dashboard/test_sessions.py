"""Session security: no default secret, sessions bounded by their link, admin revocation."""

from __future__ import annotations

import time

from fastapi.testclient import TestClient

from app.auth.models import KeyKind
from app.dashboard import sessions, tokens
from app.settings import get_settings
from tests.dashboard.test_pages import portal_link, sign_in_with_link
from tests.harness import Console


def cookie(token: str) -> dict[str, str]:
    return {"Cookie": f"{sessions.COOKIE_NAME}={token}"}


def test_a_cookie_signed_with_the_old_default_secret_is_refused(
    client: TestClient, console: Console
) -> None:
    admin_id = console.client.get("/v1/keys", headers=console.headers).json()["items"][0]["id"]
    claims = {"kind": KeyKind.ADMIN.value, "kid": admin_id, "cid": None, "key": True, "iat": 0}
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
