from fastapi.testclient import TestClient
from sqlalchemy import Engine, select

from app.auth.models import ApiKey
from app.core.db import transaction
from tests.harness import Console, bearer


def test_missing_key_is_401_and_says_how_to_authenticate(client: TestClient) -> None:
    response = client.get("/v1/customers")
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    [error] = response.json()["detail"]
    assert error["loc"] == ["header", "authorization"]
    assert "Authorization: Bearer" in error["msg"]


def test_invalid_key_is_401(client: TestClient) -> None:
    response = client.get("/v1/customers", headers=bearer("gm_admin_not-a-real-key"))
    assert response.status_code == 401
    assert response.json()["detail"][0]["msg"] == "invalid or revoked API key"


def test_keys_are_stored_hashed_and_shown_once(console: Console, db: Engine) -> None:
    customer = console.customer()
    issued = console.post(f"/v1/customers/{customer['id']}/keys", {"name": "ci"})
    assert issued["key"].startswith("gm_customer_")
    assert issued["prefix"] == issued["key"][:12]
    with transaction(db) as session:
        stored = session.scalar(select(ApiKey).where(ApiKey.id == issued["id"]))
        assert stored is not None
        assert issued["key"] not in (stored.key_hash, stored.prefix)
        assert len(stored.key_hash) == 64
    listed = console.client.get(f"/v1/customers/{customer['id']}/keys", headers=console.headers)
    assert "key" not in listed.json()["items"][0]


def test_revoked_key_stops_working(console: Console) -> None:
    customer = console.customer()
    issued = console.post(f"/v1/customers/{customer['id']}/keys", {"name": "ci"})
    assert console.client.get("/v1/customers", headers=bearer(issued["key"])).status_code == 200
    console.post(f"/v1/keys/{issued['id']}/revoke", {}, status=200)
    assert console.client.get("/v1/customers", headers=bearer(issued["key"])).status_code == 401


def test_customer_key_cannot_use_admin_routes(console: Console) -> None:
    customer = console.customer()
    issued = console.post(f"/v1/customers/{customer['id']}/keys", {"name": "ci"})
    response = console.client.post(
        "/v1/customers", json={"name": "x"}, headers=bearer(issued["key"])
    )
    assert response.status_code == 403
    assert response.json()["detail"][0]["msg"] == "this endpoint needs a admin key"


def test_node_token_rotation_revokes_the_old_token(console: Console) -> None:
    registered = console.node()
    old = registered["token"]["key"]
    assert old.startswith("gm_node_")
    new = console.post(f"/v1/nodes/{registered['node']['id']}/token", {})["key"]
    keys = console.client.get("/v1/keys?kind=node", headers=console.headers).json()["items"]
    assert [k["revoked_at"] is None for k in keys] == [False, True]
    assert new != old


def test_node_token_cannot_read_the_console_api(console: Console) -> None:
    token = console.node()["token"]["key"]
    assert console.client.get("/v1/customers", headers=bearer(token)).status_code == 403


def test_the_last_active_admin_key_cannot_be_revoked(console: Console) -> None:
    only = console.client.get("/v1/keys", headers=console.headers).json()["items"][0]["id"]
    refused = console.post(f"/v1/keys/{only}/revoke", {}, status=409)
    assert refused["detail"][0]["loc"] == ["path", "key_id"]
    assert "last active admin key" in refused["detail"][0]["msg"]
    second = console.post("/v1/keys", {"name": "second"})
    assert console.post(f"/v1/keys/{only}/revoke", {}, status=200)["revoked_at"]
    # Now the second is the last one, even for itself.
    second_console = Console(console.client, second["key"])
    second_console.post(f"/v1/keys/{second['id']}/revoke", {}, status=409)
