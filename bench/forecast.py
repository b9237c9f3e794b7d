"""Forecast benchmark: how far the month-end forecast is from the month's final invoice.

Replays a month of simulated history for four customers on a fresh database (the server of
GPUMETER_DATABASE_URL, default postgresql://postgres@127.0.0.1:5432/postgres), through the
service's own API in-process:

- steady: 8 GPUs rented since before the month, healthy throughout;
- growth: 4 GPUs since before the month, one more each day from day 2 (open-ended rentals);
- failure_burst: 8 GPUs; 4 of them fail for 36 h from day 6 (no spare: credited as failure);
- ending: 8 GPUs all month and a 4-GPU rental booked to end on day 15.

For forecasts made at 00:00 UTC of days 5, 10, 15 and 20 it prints the error against the
final invoice's rental lines (charges, credits and caps: the forecast is before vouchers and
tax), then one JSON line. Goal: |error| <= 5 % from day 10 on in every scenario.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import Engine

from app.auth.models import KeyKind
from app.auth.service import issue_key
from app.billing.endpoints import clock
from app.core.db import get_engine, transaction
from app.core.epoch import epoch
from app.core.scratch_db import scratch_database, server_from_environment
from app.main import create_app
from app.metering.segments import Span
from app.simulate import store

MONTH = datetime(2026, 1, 1, tzinfo=UTC)
MONTH_END = datetime(2026, 2, 1, tzinfo=UTC)
FORECAST_DAYS = (5, 10, 15, 20)
GOAL_PERCENT = Decimal(5)
GOAL_FROM_DAY = 10
PRICE = "2.49"
NOT_RENTAL_LINES = {"voucher", "tax", "prepaid_balance", "adjustment", "credit_note"}


@dataclass(frozen=True)
class Rental:
    gpus: int
    start: datetime
    end: datetime | None = None  # booked end, known when the rental is made


@dataclass(frozen=True)
class Scenario:
    name: str
    rentals: list[Rental]
    # (rental index, GPU index within it, failed from, failed until)
    failures: list[tuple[int, int, datetime, datetime]]


def day(n: float) -> datetime:
    """The start of day ``n`` of the month (day 1 is its first)."""
    return MONTH + timedelta(days=n - 1)


def scenarios(scale: int) -> list[Scenario]:
    """The four cases; ``scale`` multiplies every GPU count."""
    before = MONTH - timedelta(days=10)
    burst = [(0, i, day(6), day(7.5)) for i in range(4 * scale)]
    return [
        Scenario("steady", [Rental(8 * scale, before)], []),
        Scenario(
            "growth",
            [Rental(scale, day(d)) for d in range(2, 32)] + [Rental(4 * scale, before)],
            [],
        ),
        Scenario("failure_burst", [Rental(8 * scale, before)], burst),
        Scenario("ending", [Rental(8 * scale, before), Rental(4 * scale, before, day(15.5))], []),
    ]


class Api:
    """The service in-process, with an admin key and a settable clock."""

    def __init__(self, client: TestClient, key: str, now: Callable[[datetime], None]) -> None:
        self.client, self.headers, self.set_now = client, {"Authorization": f"Bearer {key}"}, now

    def post(self, path: str, body: dict[str, Any], status: int = 201) -> Any:
        response = self.client.post(path, json=body, headers=self.headers)
        if response.status_code != status:
            raise RuntimeError(f"POST {path}: {response.status_code} {response.text}")
        return response.json()

    def get(self, path: str) -> Any:
        response = self.client.get(path, headers=self.headers)
        if response.status_code != 200:
            raise RuntimeError(f"GET {path}: {response.status_code} {response.text}")
        return response.json()


@contextmanager
def service(engine: Engine) -> Iterator[Api]:
    app = create_app(engine, worker=False)
    with transaction(engine) as session:
        key = issue_key(session, KeyKind.ADMIN, "forecast bench").secret
    with TestClient(app) as client:

        def set_now(now: datetime) -> None:
            app.dependency_overrides[clock] = lambda: now

        yield Api(client, key, set_now)


def build(api: Api, engine: Engine, scenario: Scenario, plan_id: str) -> str:
    """The scenario's customer, rentals, GPUs and the whole month's telemetry; its id."""
    customer = api.post("/v1/customers", {"name": scenario.name, "currency": "USD"})["id"]
    node = api.post("/v1/nodes", {"hostname": f"node-{scenario.name}", "datacenter": "fra1"})
    runs: dict[str, list[Span]] = {}
    for r, rental in enumerate(scenario.rentals):
        body = {
            "customer_id": customer,
            "plan_id": plan_id,
            "gpu_model": "H100",
            "gpu_count": rental.gpus,
            "start_at": rental.start.isoformat(),
            "end_at": None if rental.end is None else rental.end.isoformat(),
        }
        rental_id = api.post("/v1/rentals", body)["id"]
        for g in range(rental.gpus):
            gpu = f"GPU-{scenario.name}-{r}-{g}"
            api.post("/v1/gpus", {"uuid": gpu, "node_id": node["node"]["id"], "model": "H100"})
            assignment = {"gpu_uuid": gpu, "start_at": rental.start.isoformat()}
            api.post(f"/v1/rentals/{rental_id}/assignments", assignment)
            failed = [(a, b) for i, j, a, b in scenario.failures if (i, j) == (r, g)]
            runs[gpu] = _states(rental.start, rental.end or MONTH_END, failed)
    with transaction(engine) as session:
        store.write_history(session, runs, [])
    return str(customer)


def _states(start: datetime, end: datetime, failed: list[tuple[datetime, datetime]]) -> list[Span]:
    """Healthy from ``start`` to ``end`` but for the failed spans."""
    spans, at = [], epoch(start)
    for a, b in failed:
        spans += [Span(at, epoch(a), "healthy"), Span(epoch(a), epoch(b), "failed")]
        at = epoch(b)
    return [*spans, Span(at, epoch(end), "healthy")]


def invoiced(api: Api, customer: str) -> Decimal:
    """The final January invoice's rental lines (before vouchers and tax)."""
    api.set_now(MONTH_END + timedelta(days=2))
    body = {"period": "2026-01", "customer_id": customer, "finalize": True}
    [invoice_id] = api.post("/v1/invoices/runs", body, 200)["invoice_ids"]
    lines = api.get(f"/v1/invoices/{invoice_id}")["lines"]
    return sum(
        (Decimal(x["amount"]) for x in lines if x["kind"] not in NOT_RENTAL_LINES), Decimal(0)
    )


def run(scale: int) -> dict[str, Any]:
    began = time.monotonic()
    rows: dict[str, dict[str, Any]] = {}
    with scratch_database(server_from_environment(), "gpumeter_bench_forecast") as url:
        engine = get_engine(url)
        with service(engine) as api:
            api.set_now(MONTH)
            prices = [
                {
                    "gpu_model": "H100",
                    "price_per_hour": PRICE,
                    "effective_from": "2025-01-01T00:00:00Z",
                }
            ]
            plan = api.post("/v1/plans", {"name": "bench", "prices": prices, "currency": "USD"})
            for scenario in scenarios(scale):
                customer = build(api, engine, scenario, plan["id"])
                forecasts, new_rentals = {}, {}
                for d in FORECAST_DAYS:
                    api.set_now(day(d))
                    usage = api.get(f"/v1/customers/{customer}/usage")
                    forecasts[d] = Decimal(usage["forecast"])
                    new_rentals[str(d)] = usage["forecast_new_rentals"]
                final = invoiced(api, customer)
                errors = {d: (f - final) * 100 / final for d, f in forecasts.items()}
                rows[scenario.name] = {
                    "invoice": str(final),
                    "forecast": {str(d): str(f) for d, f in forecasts.items()},
                    "of_which_new_rentals": new_rentals,
                    "error_percent": {str(d): float(round(e, 2)) for d, e in errors.items()},
                }
                print(_row(scenario.name, final, errors), file=sys.stderr, flush=True)
        engine.dispose()
    worst = max(
        abs(Decimal(str(e)))
        for r in rows.values()
        for d, e in r["error_percent"].items()
        if int(d) >= GOAL_FROM_DAY
    )
    return {
        "scenarios": rows,
        "worst_error_percent_from_day_10": float(worst),
        "goal_percent": float(GOAL_PERCENT),
        "met": worst <= GOAL_PERCENT,
        "wall_seconds": round(time.monotonic() - began, 1),
    }


def _row(name: str, final: Decimal, errors: dict[int, Decimal]) -> str:
    cells = "  ".join(f"day {d:>2}: {e:+6.2f} %" for d, e in errors.items())
    return f"{name:<14} invoice {final:>10}  {cells}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=int, default=1, help="multiply every GPU count")
    args = parser.parse_args()
    print(f"{'scenario':<14} {'final':>18}  forecast error by the day it was made", file=sys.stderr)
    result = run(args.scale)
    print(json.dumps(result))
    return 0 if result["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
