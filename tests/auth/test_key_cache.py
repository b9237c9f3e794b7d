"""Keys are cached per process; a key revoked elsewhere stops working within the bound."""

from __future__ import annotations

import uuid

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, event, text

from app.auth import cache
from app.core.db import transaction
from tests.harness import Console, bearer

BOUND_S = 5.0


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(db: Engine, monkeypatch: pytest.MonkeyPatch) -> Clock:
    """A fresh key cache for the test database, on a clock the test moves."""
    clock = Clock()
    monkeypatch.setitem(cache._CACHES, db, cache.KeyCache(BOUND_S, clock))
    return clock


def _revoke_elsewhere(db: Engine, key_id: str) -> None:
    """As another service process or the CLI would: straight in the database."""
    with transaction(db) as session:
        session.execute(
            text("UPDATE api_keys SET revoked_at = now() WHERE id = :id"), {"id": uuid.UUID(key_id)}
        )


def _ingest(client: TestClient, token: str) -> int:
    body = {"batch_id": "b1", "protocol_version": 1, "records": [], "events": []}
    return client.post("/v1/ingest", json=body, headers=bearer(token)).status_code


def test_a_node_token_revoked_elsewhere_stops_working_within_the_bound(
    console: Console, db: Engine, clock: Clock
) -> None:
    registered = console.node()
    token = registered["token"]["key"]
    assert _ingest(console.client, token) == 200
    _revoke_elsewhere(db, registered["token"]["id"])
    clock.now += BOUND_S - 0.1
    assert _ingest(console.client, token) == 200  # still trusted from memory, inside the bound
    clock.now += 0.1
    assert _ingest(console.client, token) == 401  # the bound reached: re-verified, refused


def test_a_customer_key_revoked_elsewhere_stops_working_within_the_bound(
    console: Console, db: Engine, clock: Clock
) -> None:
    customer = console.customer()
    issued = console.post(f"/v1/customers/{customer['id']}/keys", {"name": "ci"})
    assert console.client.get("/v1/customers", headers=bearer(issued["key"])).status_code == 200
    _revoke_elsewhere(db, issued["id"])
    clock.now += BOUND_S
    assert console.client.get("/v1/customers", headers=bearer(issued["key"])).status_code == 401


def test_a_cached_key_costs_no_query_until_the_check_is_due(
    console: Console, db: Engine, clock: Clock
) -> None:
    token = console.node()["token"]["key"]
    assert _ingest(console.client, token) == 200
    statements: list[str] = []

    def record(conn: object, cursor: object, statement: str, *args: object) -> None:
        statements.append(statement)

    event.listen(db, "before_cursor_execute", record)
    try:
        assert _ingest(console.client, token) == 200
        key_reads = [s for s in statements if "api_keys" in s]
        assert key_reads == []
        clock.now += BOUND_S
        statements.clear()
        assert _ingest(console.client, token) == 200
        assert len([s for s in statements if "api_keys" in s]) == 1  # one re-check of all
    finally:
        event.remove(db, "before_cursor_execute", record)


def test_a_key_revoked_through_this_process_stops_at_once(console: Console, clock: Clock) -> None:
    registered = console.node()
    old = registered["token"]["key"]
    assert _ingest(console.client, old) == 200
    console.post(f"/v1/nodes/{registered['node']['id']}/token", {})  # rotation revokes it
    assert _ingest(console.client, old) == 401
