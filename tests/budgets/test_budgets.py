"""Budgets: thresholds of actual and forecast spend, one event per crossing, the hard limit."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from fastapi.testclient import TestClient

from app.settings import get_settings
from tests.dashboard import world
from tests.dashboard.world import World
from tests.harness import Console, bearer


def test_thresholds_cross_once_each_with_an_event_and_a_banner(
    client: TestClient, console: Console, seeded: World, october: None
) -> None:
    acme = seeded.acme
    headers = bearer(acme.key)
    base = f"/v1/customers/{acme.customer['id']}"
    budget = client.post(f"{base}/budgets", json={"amount": "100"}, headers=headers)
    assert budget.status_code == 201, budget.text
    usage = client.get(f"{base}/usage", headers=headers).json()
    [status] = client.get(f"{base}/budgets/status", headers=headers).json()["items"]
    assert status["spend"] == usage["cost_to_date"] and status["forecast"] == usage["forecast"]
    crossed = {(t["basis"], t["percent"]) for t in status["thresholds"] if t["crossed"]}
    # €57.79 spent of €100, €115.58 forecast: 50 % of actual and 100 % of forecast.
    assert crossed == {("actual", 50), ("forecast", 100)}
    first = console.post("/v1/budget-checks", {}, status=200)
    again = console.post("/v1/budget-checks", {}, status=200)
    assert (first["crossed"], again["crossed"]) == (2, 0)
    events = client.get("/v1/events?type=budget.threshold_crossed", headers=console.headers)
    items = [e for e in events.json()["items"] if e["type"] == "budget.threshold_crossed"]
    assert sorted((e["data"]["basis"], e["data"]["percent"]) for e in items) == [
        ("actual", 50),
        ("forecast", 100),
    ]
    assert {e["customer_id"] for e in items} == {acme.customer["id"]}
    html = client.get("/dashboard", headers=headers).text
    assert "Spend has passed 50 % of your €100.00 monthly budget" in html
    assert f"the month-end forecast €{usage['forecast']} is over 100 % of it" in html


def test_a_customer_cannot_budget_another_customers_rental(
    client: TestClient, seeded: World
) -> None:
    response = client.post(
        f"/v1/customers/{seeded.acme.customer['id']}/budgets",
        json={"amount": "10", "rental_id": seeded.other.rental["id"]},
        headers=bearer(seeded.acme.key),
    )
    assert response.status_code == 404
    other = client.get(
        f"/v1/customers/{seeded.acme.customer['id']}/budgets", headers=bearer(seeded.other.key)
    )
    assert other.status_code == 404


def test_hard_limit_refuses_new_rentals_and_says_why(client: TestClient, console: Console) -> None:
    customer = console.customer("Capped", currency="EUR")
    plan = console.plan("capped-plan", currency="EUR")
    registered = console.node("node-capped")
    node, token = registered["node"], registered["token"]["key"]
    console.gpu(node["id"], "GPU-C-1")
    now = int(time.time())
    start = now - now % 60 - 3600
    rental = console.rental(customer["id"], plan["id"], start_at=_iso(start))
    console.assign(rental["id"], "GPU-C-1", _iso(start))
    world._ingest(console.client, token, world._minutes("GPU-C-1", start, start + 1800), [])
    key = console.post(f"/v1/customers/{customer['id']}/keys", {"name": "k"})["key"]
    base = f"/v1/customers/{customer['id']}/budgets"
    limit = client.post(base, json={"amount": "0.50", "hard_limit": True}, headers=bearer(key))
    assert limit.status_code == 201
    refused = client.post(
        "/v1/rentals",
        json=console.rental_body(customer["id"], plan["id"], start_at=_iso(now)),
        headers=console.headers,
    )
    assert refused.status_code == 409, refused.text
    [error] = refused.json()["detail"]
    assert error["loc"] == ["body", "customer_id"] and error["budget_id"] == limit.json()["id"]
    assert "reached its monthly budget hard limit" in error["msg"]
    banner = client.get("/dashboard", headers=bearer(key)).text
    assert "Its hard limit is reached: no new rentals can start" in banner
    deleted = client.delete(f"/v1/budgets/{limit.json()['id']}", headers=bearer(key))
    assert deleted.status_code == 200 and deleted.json()["id"] == limit.json()["id"]
    console.post("/v1/rentals", console.rental_body(customer["id"], plan["id"], start_at=_iso(now)))


def _iso(second: int) -> str:
    return datetime.fromtimestamp(second, UTC).isoformat()


@pytest.fixture
def three_budgets_each(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("GPUMETER_MAX_BUDGETS_PER_CUSTOMER", "3")
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


@pytest.mark.usefixtures("three_budgets_each")
def test_a_customer_key_cannot_create_budgets_without_end(
    client: TestClient, console: Console
) -> None:
    customer = console.customer()
    key = console.post(f"/v1/customers/{customer['id']}/keys", {"name": "k"})["key"]
    base = f"/v1/customers/{customer['id']}/budgets"
    made = [client.post(base, json={"amount": "10"}, headers=bearer(key)) for _ in range(3)]
    assert [r.status_code for r in made] == [201, 201, 201]
    refused = client.post(base, json={"amount": "10"}, headers=bearer(key))
    assert refused.status_code == 409, refused.text
    assert refused.json()["detail"][0]["msg"] == (
        f"customer {customer['id']} has 3 budgets, the most one may have: delete one first "
        "(GPUMETER_MAX_BUDGETS_PER_CUSTOMER)"
    )
    client.delete(f"/v1/budgets/{made[0].json()['id']}", headers=bearer(key))
    assert client.post(base, json={"amount": "10"}, headers=bearer(key)).status_code == 201
