"""One customer's bad data never stops the others' invoices: each customer of a run is billed
in a savepoint of its own and a failure is reported with its reason; times and prices out of
range are refused where they enter, naming the field."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy import Engine, text

from app.billing import run as billing_run
from app.billing import service as billing_service
from app.core.money import MAX_HOURLY_PRICE, MONEY_LIMIT
from app.rentals.models import MAX_GPUS
from app.schedule.service import tick
from app.settings import get_settings
from tests.billing.world import get, october_with_failure, write_telemetry
from tests.harness import Console

# Planted by SQL (the API refuses them now): what an admin could once enter.
PLANTED = {
    # A month at this price overflows the invoice's amount column.
    "price": "UPDATE plan_prices SET price_per_hour = 1e16 WHERE plan_id = :plan",
    # Entered as 0001-01-01T00:00:00+01:00: year 0 in UTC, which Python cannot read back.
    "year_0": "UPDATE rentals SET start_at = '0001-01-01 00:00:00 BC' WHERE id = :rental",
    # Entered as 9999-12-31T23:00:00-05:00: year 10000 in UTC.
    "year_10000": "UPDATE rentals SET end_at = '10000-01-01 04:00:00+00' WHERE id = :rental",
}


def _october_of_three(console: Console, db: Engine, planted: str) -> dict[str, Any]:
    """Acme (the billing world's October), Beta (one H100 for 19 days at 1.99/h) and Bad (like
    Beta on a plan of its own), then ``planted`` for Bad."""
    acme = october_with_failure(console, db).customer
    node = console.node("node-2")["node"]
    customers = {"acme": acme}
    for name, gpu in (("beta", "GPU-C"), ("bad", "GPU-D")):
        customer = customers[name] = console.customer(name.title())
        plan = console.plan(f"{name}-plan", price="1.99")
        console.gpu(node["id"], gpu)
        rental = console.rental(customer["id"], plan["id"], start_at="2026-10-01T00:00:00Z")
        console.assign(rental["id"], gpu, "2026-10-01T00:00:00Z")
        write_telemetry(db, gpu, [("2026-10-01T00:00:00", "2026-10-20T00:00:00", "healthy")])
    with db.begin() as conn:
        conn.execute(text(PLANTED[planted]), {"plan": plan["id"], "rental": rental["id"]})
    return customers


@pytest.mark.parametrize("planted", list(PLANTED))
@pytest.mark.parametrize("finalize", [False, True])
def test_a_bad_row_of_one_customer_leaves_the_others_billed_and_is_reported(
    console: Console, db: Engine, now: datetime, planted: str, finalize: bool
) -> None:
    customers = _october_of_three(console, db, planted)
    bad = customers["bad"]["id"]
    run = console.post("/v1/invoices/runs", {"period": "2026-10", "finalize": finalize}, 200)
    outcome = "finalized" if finalize else "drafted"
    assert run["counts"] == {outcome: 2, "failed": 1}
    [failure] = run["failures"]
    assert failure["customer_id"] == bad
    reason = "exceed what an invoice holds" if planted == "price" else "cannot store or give back"
    assert reason in failure["msg"]
    billed = {i["customer_id"]: i for i in get(console, "/v1/invoices")["items"]}
    assert set(billed) == {customers["acme"]["id"], customers["beta"]["id"]}
    # Acme's figures are those of its run alone; Beta: 19 days x 24 h x 1.99 = 907.44.
    assert billed[customers["acme"]["id"]]["total"] == "2202.20"
    assert billed[customers["beta"]["id"]]["total"] == "907.44"
    if finalize:  # gapless: the failed customer's finalization gave its number back
        numbers = sorted(i["number"] for i in billed.values())
        assert numbers == ["GM-2026-000001", "GM-2026-000002"]
    assert get(console, f"/v1/invoices?customer_id={bad}")["items"] == []


def test_a_customer_whose_prices_overflow_keeps_its_pages(
    console: Console, db: Engine, now: datetime
) -> None:
    """Nothing of the failed customer is half-written, so its pages answer as before."""
    bad = _october_of_three(console, db, "price")["bad"]["id"]
    console.post("/v1/invoices/runs", {"period": "2026-10"}, 200)
    for page in ("usage?period=2026-10", "amount-due?period=2026-10", "vouchers", "credit-notes"):
        get(console, f"/v1/customers/{bad}/{page}")
    assert len(get(console, f"/v1/rentals?customer_id={bad}")["items"]) == 1


def test_the_scheduled_run_bills_a_zone_in_one_batch_and_reports_the_bad_customer(
    console: Console, db: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    customers = _october_of_three(console, db, "price")
    batches: list[int] = []
    real = billing_service.draft_batch

    def counted(session: Any, zone_customers: Any, *args: Any) -> Any:
        batches.append(len(zone_customers))
        return real(session, zone_customers, *args)

    monkeypatch.setattr(billing_run, "draft_batch", counted)
    [run_id] = tick(db, get_settings(), datetime(2026, 11, 5, 12, 0, tzinfo=UTC))
    assert batches == [3]  # the zone's three customers in one read, as the API runs them
    [run] = get(console, "/v1/scheduled-invoice-runs")["items"]
    assert (run["id"], run["status"], run["customers"]) == (run_id, "succeeded", 3)
    assert run["counts"] == {"finalized": 2, "failed": 1}
    assert list(run["failures"]) == [customers["bad"]["id"]]


START = "2026-11-01T00:00:00Z"


@pytest.mark.parametrize(
    "moment",
    [
        "0001-01-01T00:00:00+01:00",  # year 0 in UTC
        "9999-12-31T23:00:00-05:00",  # year 10000 in UTC
        "1969-12-31T23:59:59Z",
        "2200-01-01T00:00:00Z",
        "2199-12-31T23:00:00-01:00",  # 2200 after its offset
    ],
)
def test_times_out_of_range_are_refused_where_they_enter(
    console: Console, now: datetime, moment: str
) -> None:
    customer = console.customer("Acme")
    plan = console.plan()
    body = console.rental_body(customer["id"], plan["id"])
    rental = console.rental(customer["id"], plan["id"])
    price = {"gpu_model": "H100", "price_per_hour": "1", "effective_from": moment}
    cases: list[tuple[str, dict[str, Any], list[str | int]]] = [
        ("/v1/rentals", {**body, "start_at": moment}, ["body", "start_at"]),
        ("/v1/rentals", {**body, "end_at": moment}, ["body", "end_at"]),
        (f"/v1/rentals/{rental['id']}/end", {"end_at": moment}, ["body", "end_at"]),
        (
            f"/v1/rentals/{rental['id']}/assignments",
            {"gpu_uuid": "GPU-A", "start_at": moment},
            ["body", "start_at"],
        ),
        ("/v1/plans", {"name": "p", "prices": [price]}, ["body", "prices", 0, "effective_from"]),
        ("/v1/invoices/runs", {"period": "2026-10", "as_of": moment}, ["body", "as_of"]),
    ]
    for path, sent, loc in cases:
        refused = console.post(path, sent, 422)["detail"]
        assert [e["loc"] for e in refused] == [loc], (path, refused)
        assert "out of range" in refused[0]["msg"] and "1970-01-01" in refused[0]["msg"]
    listed = console.client.get(
        "/v1/rentals", params={"active_from": moment}, headers=console.headers
    )
    assert listed.status_code == 422 and listed.json()["detail"][0]["loc"] == [
        "query",
        "active_from",
    ]
    assert get(console, f"/v1/rentals?customer_id={customer['id']}")["items"] == [
        get(console, f"/v1/rentals/{rental['id']}")
    ]


def test_the_edges_of_the_range_are_taken(console: Console) -> None:
    customer, plan = console.customer("Acme"), console.plan()
    rental = console.rental(
        customer["id"],
        plan["id"],
        start_at="1970-01-01T01:00:00+01:00",
        end_at="2199-12-31T23:59:59Z",
    )
    taken = [datetime.fromisoformat(rental[field]) for field in ("start_at", "end_at")]
    assert taken == [
        datetime(1970, 1, 1, tzinfo=UTC),
        datetime(2199, 12, 31, 23, 59, 59, tzinfo=UTC),
    ]


def test_a_price_whose_month_could_overflow_an_invoice_is_refused(console: Console) -> None:
    # A month (745 h) of the largest rental at the highest price, with tax below 100 %, fits.
    assert MAX_HOURLY_PRICE * 745 * MAX_GPUS * 2 < MONEY_LIMIT
    top = console.plan("top", price=f"{MAX_HOURLY_PRICE:f}")
    assert Decimal(top["prices"][0]["price_per_hour"]) == MAX_HOURLY_PRICE
    over = {
        "gpu_model": "H100",
        "price_per_hour": "1000000000.01",
        "effective_from": "2026-01-01T00:00:00Z",
    }
    for field in ("price_per_hour", "preemptible_price_per_hour"):
        price = {**over, "price_per_hour": "1", field: over["price_per_hour"]}
        refused = console.post("/v1/plans", {"name": "over", "prices": [price]}, 422)["detail"]
        assert [e["loc"] for e in refused] == [["body", "prices", 0, field]]
        assert "less than or equal to 1000000000" in refused[0]["msg"]
