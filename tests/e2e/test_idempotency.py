"""A retry after a lost answer, against a real `gpumeter serve`: the client's connection drops
after the server committed (it never reads the answer), the client retries with the same
Idempotency-Key, and gets the first answer; exactly one object exists."""

from __future__ import annotations

import json
import socket
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, text

from tests.e2e.conftest import Fleet
from tests.harness import wait_for


def count(db: Engine, sql: str, **params: Any) -> int:
    with db.connect() as connection:
        return int(connection.scalar(text(sql), params))


def send_and_hang_up(fleet: Fleet, path: str, body: dict[str, Any], key: str, done: Any) -> None:
    """POST over a raw socket, wait until ``done()`` (the server committed), then close the
    connection without reading a byte of the answer: a client whose read timed out."""
    payload = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {fleet.admin}\r\nIdempotency-Key: {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", fleet.service.port), timeout=10) as sock:
        sock.sendall(head.encode() + payload)
        wait_for(done, f"the server to commit {path}")


@pytest.mark.e2e
def test_a_retry_after_a_dropped_connection_gets_the_first_answer(fleet: Fleet, db: Engine) -> None:
    url, auth = fleet.service.url, {"Authorization": f"Bearer {fleet.admin}"}
    customers = [
        httpx.post(f"{url}/v1/customers", json={"name": n}, headers=auth, timeout=10).json()
        for n in ("Acme", "Globex")
    ]
    acme = customers[0]
    top_up = {"amount": "500.00", "reason": "wire 2026-12-07"}
    path = f"/v1/customers/{acme['id']}/balance/top-ups"
    top_ups = "SELECT count(*) FROM balance_entries WHERE customer_id = :c AND kind = 'top_up'"
    send_and_hang_up(
        fleet, path, top_up, "wire-0042", lambda: count(db, top_ups, c=acme["id"]) == 1
    )
    retry = httpx.post(
        url + path, json=top_up, headers={**auth, "Idempotency-Key": "wire-0042"}, timeout=10
    )
    assert retry.status_code == 201, retry.text
    assert retry.headers["idempotent-replayed"] == "true"
    assert (retry.json()["amount"], retry.json()["balance"]) == ("500.00", "500.00")
    assert count(db, top_ups, c=acme["id"]) == 1
    balance = httpx.get(f"{url}/v1/customers/{acme['id']}/balance", headers=auth, timeout=10)
    assert balance.json()["balance"] == "500.00"
    # A rental the same way: one rental, the retry answers its id.
    plan = httpx.post(
        f"{url}/v1/plans",
        json={
            "name": "on-demand",
            "prices": [
                {
                    "gpu_model": "H100",
                    "price_per_hour": "2.49",
                    "effective_from": "2026-01-01T00:00:00Z",
                }
            ],
        },
        headers=auth,
        timeout=10,
    ).json()
    rental = {
        "customer_id": customers[1]["id"],
        "plan_id": plan["id"],
        "gpu_model": "H100",
        "gpu_count": 2,
        "start_at": "2026-11-01T00:00:00Z",
    }
    rentals = "SELECT count(*) FROM rentals WHERE customer_id = :c"
    send_and_hang_up(
        fleet,
        "/v1/rentals",
        rental,
        "rent-globex-1",
        lambda: count(db, rentals, c=customers[1]["id"]) == 1,
    )
    again = httpx.post(
        f"{url}/v1/rentals",
        json=rental,
        headers={**auth, "Idempotency-Key": "rent-globex-1"},
        timeout=10,
    )
    assert again.status_code == 201 and again.headers["idempotent-replayed"] == "true"
    listed = httpx.get(
        f"{url}/v1/rentals", params={"customer_id": customers[1]["id"]}, headers=auth, timeout=10
    ).json()["items"]
    assert [r["id"] for r in listed] == [again.json()["id"]]
