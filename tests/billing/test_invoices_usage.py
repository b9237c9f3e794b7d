"""Live usage (buckets, effective GPU-hours, cost to date, forecast) and what-if, via the API."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from sqlalchemy import Engine

from tests.billing.world import get, october_with_failure, run_invoice
from tests.harness import Console


def test_usage_of_a_closed_and_of_the_current_month(
    console: Console, db: Engine, now: datetime
) -> None:
    customer = october_with_failure(console, db).customer["id"]
    october = get(console, f"/v1/customers/{customer}/usage?period=2026-10")
    assert {k: v for k, v in october["buckets_s"].items() if v} == {
        "billable": 2_675_550,
        "failure_credit": 2820,
        "migration_credit": 30,
    }
    assert october["effective"] == {
        "rented_s": 2_678_400,
        "credited_s": 2850,
        "idle_s": 0,  # no minute metrics: unknown is not idle
        "unmeasured_s": 0,
        "effective_s": 2_675_550,
        "effective_gpu_hours": "743.208333",
    }
    assert (october["cost_to_date"], october["forecast"]) == ("1850.59", "1850.59")

    # November to date (pinned at Nov 5 12:00): 4.5 days = 388,800 s -> 268.92; a steady
    # rental forecasts the whole month: 268.92 x 2,592,000 / 388,800 = 1792.80.
    november = get(console, f"/v1/customers/{customer}/usage")
    assert november["period"] == "2026-11" and november["as_of"] == "2026-11-05T12:00:00Z"
    assert (november["cost_to_date"], november["forecast"]) == ("268.92", "1792.80")
    assert november["rentals"][0]["running"] is True


def test_what_if_at_1_60_and_3600_s_with_and_without_credits(
    console: Console, db: Engine, now: datetime
) -> None:
    customer = october_with_failure(console, db).customer["id"]
    table = get(console, f"/v1/customers/{customer}/what-if?period=2026-10")
    assert table["manual_recovery_s"] == 2820
    rows = [
        (
            r["increment_s"],
            r["with_credits"]["amount"],
            r["with_credits"]["billed_s"],
            r["without_credits"]["amount"],
            r["without_credits"]["billed_s"],
        )
        for r in table["rows"]
    ]
    # Sessions: GPU-A 820,800 s billed and 2,820 s failed, rounded together: 823,620 s is whole
    # minutes and 780 s short of an hour. GPU-B 1,854,750 s rounds up by 30 s to the minute
    # and by 2,850 s to the hour. So at every increment the credits take off exactly the
    # downtime, 2,850 s. It already exceeds the 47-minute manual recovery: no top-up.
    assert rows == [
        (1, "1850.59", 2_675_550, "1852.56", 2_678_400),
        (60, "1850.61", 2_675_580, "1852.58", 2_678_430),
        (3600, "1853.10", 2_679_180, "1855.07", 2_682_030),
    ]
    assert all(without - with_ == 2850 for _, _, with_, _, without in rows)


CAPPED = {
    "prices": [
        {
            "gpu_model": "H100",
            "price_per_hour": "2.49",
            "monthly_cap_per_gpu": "1500.00",
            "effective_from": "2026-01-01T00:00:00Z",
        }
    ]
}


def test_usage_what_if_and_forecast_show_the_cap(
    console: Console, db: Engine, now: datetime
) -> None:
    """Cap 1500/GPU-month. October (2,678,400 s): the 2,850 credited seconds earn no
    allowance, 1500 x 2,675,550 / 2,678,400 = 1498.40; without automatic credits the
    downtime is billed and earns the full 1500.00. November to date (388,800 s of
    2,592,000): 225.00, forecast 1500.00."""
    customer = october_with_failure(console, db, plan_fields=CAPPED).customer["id"]
    october = get(console, f"/v1/customers/{customer}/usage?period=2026-10")
    assert (october["cost_to_date"], october["forecast"]) == ("1498.40", "1498.40")
    assert october["rentals"][0]["cap_allowance"] == "1498.40"
    table = get(console, f"/v1/customers/{customer}/what-if?period=2026-10")
    one_s = table["rows"][0]
    assert (one_s["with_credits"]["amount"], one_s["without_credits"]["amount"]) == (
        "1498.40",
        "1500.00",
    )
    assert one_s["difference"] == "1.60"
    invoice = run_invoice(console, "2026-10")
    assert sum(Decimal(x["amount"]) for x in invoice["lines"] if x["kind"] != "tax") == Decimal(
        "1498.40"
    )

    november = get(console, f"/v1/customers/{customer}/usage")
    assert (november["cost_to_date"], november["forecast"]) == ("225.00", "1500.00")
