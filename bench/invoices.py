"""Invoice-run benchmark: a synthetic month at 1x, 2x and 4x of 7,500 GPUs and 750 customers,
and one customer renting 3,000 GPUs for 60 days (the seed's flagship: its month's invoice).

Per scale: customers (three billing time zones), one plan, rentals of 2 GPUs each over the
month (some start late), failures at 0.72 % per GPU per day (a failed segment of 5-60 min with
XID evidence), each followed by a migration to a spare GPU 30 s later; telemetry as state
segments with an occasional unmetered gap. All rows go into the real tables with COPY. Then
``run_invoices`` drafts every customer's October invoice in one transaction, timed. The big
customer: 375 rentals of 8 GPUs from September 1 to the end of October, the same failure
model; its October invoice is drafted alone (``run_invoices(customer_id=...)``), timed.

``--gpus``, ``--customers`` (at 1x) and ``--big-gpus`` size the fleets; the targets are for the
sizes above. The tests run a tiny configuration (``--scales 1 --gpus 40 --customers 6
--big-gpus 16``) so that a bench that stops running fails CI.

Prints progress on stderr and one final JSON line on stdout. Creates and drops its own
database on the server of GPUMETER_DATABASE_URL (default postgresql://postgres@127.0.0.1/postgres).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import psycopg
from sqlalchemy import create_engine

import app.models  # noqa: F401 - every table registered, so foreign keys resolve
from app.billing.loader import billing_period
from app.billing.progress import ProgressBar
from app.billing.run import run_invoices
from app.billing.service import BillingSettings
from app.core.db import transaction
from app.core.epoch import from_epoch
from app.core.scratch_db import libpq_dsn, scratch_database, server_from_environment
from app.metering import retention
from app.settings import Settings, sqlalchemy_url

GPUS, CUSTOMERS = 7500, 750
BIG_GPUS, BIG_RENTAL_GPUS, BIG_DAYS = 3000, 8, 60
TARGET_30K_S, TARGET_BIG_S = 20.0, 2.0
FAILURES_PER_GPU_DAY = 0.0072
PERIOD = "2026-10"
ZONES = ("UTC", "Europe/Berlin", "America/New_York")
NOW = datetime(2026, 11, 10, tzinfo=UTC)  # after every zone's October
# What COPY writes into each table, in the order its foreign keys need.
COLUMNS = {
    "customers": "id, name, currency, billing_timezone, tax_rate, collection_method, "
    "days_until_due",
    "nodes": "id, hostname, datacenter",
    "gpus": "uuid, node_id, model, pool",
    "price_plans": "id, name, currency, increment_s, minimum_s, bill_degraded, bill_unmetered, "
    "voucher_tiers, voucher_validity_days",
    "plan_prices": "plan_id, gpu_model, price_per_hour, effective_from",
    "rentals": "id, customer_id, plan_id, gpu_model, gpu_count, start_at, end_at",
    "gpu_assignments": "rental_id, customer_id, gpu_uuid, start_at, end_at",
    "rental_migrations": "rental_id, customer_id, from_gpu_uuid, to_gpu_uuid, failed_at, "
    "resumed_at, reason",
    "gpu_state_segments": 'gpu_uuid, start, "end", state, evidence',
}


class Fleet:
    """The synthetic rows of one scale, as tuples ready for COPY."""

    def __init__(
        self, gpus: int, customers: int, seed: int, *, rental_gpus: int = 2, days: int = 0
    ) -> None:
        self.rng = random.Random(seed)
        # Pad by a day: customers in other zones have months that start or end off UTC's.
        start, end = billing_period(PERIOD, "UTC").span
        self.start, self.end = start - 86400, end + 86400
        self.whole = days > 0  # every rental runs the whole ``days`` up to the period end
        if self.whole:
            self.start = end - days * 86400
        self.rental_gpus = rental_gpus
        self.rows: dict[str, list[tuple[Any, ...]]] = {table: [] for table in COLUMNS}
        self.plan = uuid.uuid4()
        self._plan()
        self.customer_ids = self._customers_and_rentals(gpus, customers)

    def _plan(self) -> None:
        tiers = json.dumps([{"min_days": 7, "percent": "5"}, {"min_days": 30, "percent": "15"}])
        self.rows["price_plans"].append((self.plan, "bench", "USD", 1, 1, True, False, tiers, 90))
        self.rows["plan_prices"].append(
            (self.plan, "H100", "2.49", from_epoch(self.start - 86400 * 30))
        )

    def _customers_and_rentals(self, gpus: int, customers: int) -> list[uuid.UUID]:
        ids = [uuid.uuid4() for _ in range(customers)]
        for i, cid in enumerate(ids):
            zone = ZONES[i % len(ZONES)]
            self.rows["customers"].append(
                (cid, f"bench {i}", "USD", zone, "0.19", "send_invoice", 30)
            )
        node = None
        spares: list[str] = []
        per_node = max(1, 8 // self.rental_gpus)
        for g in range(gpus // self.rental_gpus):
            if g % per_node == 0:
                node = uuid.uuid4()
                self.rows["nodes"].append((node, f"bench-{node}", "bench"))
            group = [self._gpu(node, f"GPU-{g}-{k}") for k in range(self.rental_gpus)]
            self._rental(ids[g % customers], group, spares, node)
        return ids

    def _gpu(self, node: uuid.UUID | None, name: str) -> str:
        self.rows["gpus"].append((name, node, "H100", "rentable"))
        return name

    def _rental(
        self, customer: uuid.UUID, gpus: list[str], spares: list[str], node: uuid.UUID | None
    ) -> None:
        rid = uuid.uuid4()
        start = self.start
        if not self.whole and self.rng.random() >= 0.8:
            start = self.rng.randrange(self.start, self.end)
        self.rows["rentals"].append(
            (rid, customer, self.plan, "H100", len(gpus), from_epoch(start), None)
        )
        for gpu in gpus:
            self._serve(rid, customer, gpu, start, node)

    def _serve(
        self, rid: uuid.UUID, customer: uuid.UUID, gpu: str, start: int, node: uuid.UUID | None
    ) -> None:
        """One GPU serves the rental from ``start``; each failure moves it to a new spare."""
        while True:
            failure = self._next_failure(start)
            if failure is None:
                self.rows["gpu_assignments"].append((rid, customer, gpu, from_epoch(start), None))
                self._segments(gpu, start, self.end, None)
                return
            failed_at = failure + self.rng.randrange(300, 3600)
            self.rows["gpu_assignments"].append(
                (rid, customer, gpu, from_epoch(start), from_epoch(failed_at))
            )
            self._segments(gpu, start, failure, (failure, failed_at))
            spare = self._gpu(node, f"SPARE-{uuid.uuid4().hex[:12]}")
            resumed = failed_at + 30
            self.rows["rental_migrations"].append(
                (
                    rid,
                    customer,
                    gpu,
                    spare,
                    from_epoch(failed_at),
                    from_epoch(resumed),
                    "bench failure",
                )
            )
            gpu, start = spare, resumed

    def _next_failure(self, start: int) -> int | None:
        days = (self.end - start) / 86400
        if self.rng.random() >= 1 - (1 - FAILURES_PER_GPU_DAY) ** days:
            return None
        return self.rng.randrange(start, self.end - 7200)

    def _segments(self, gpu: str, start: int, end: int, failed: tuple[int, int] | None) -> None:
        runs: list[tuple[int, int, str, str | None]] = []
        if self.rng.random() < 0.05 and end - start > 7200:  # a gap: an hour never reported
            gap = self.rng.randrange(start, end - 3600)
            runs += [(start, gap, "healthy", None), (gap + 3600, end, "healthy", None)]
        else:
            runs.append((start, end, "healthy", None))
        if failed:
            xid = json.dumps({"rule": "xid", "code": 79, "event_id": f"ev-{gpu}-{failed[0]}"})
            runs.append((failed[0], failed[1], "failed", xid))
        for a, b, state, evidence in runs:
            if a < b:
                self.rows["gpu_state_segments"].append((gpu, a, b, state, evidence))


def write(conninfo: str, fleet: Fleet) -> None:
    bar = ProgressBar("tables")
    with psycopg.connect(conninfo) as conn:
        for done, (table, columns) in enumerate(COLUMNS.items(), 1):
            with conn.cursor().copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
                for row in fleet.rows[table]:
                    copy.write_row(row)
            bar(done, len(COLUMNS))


def truncate(conninfo: str) -> None:
    with psycopg.connect(conninfo) as conn:
        conn.execute(
            "TRUNCATE invoice_lines, voucher_entries, invoices, invoice_number_counters, "
            + ", ".join(COLUMNS)
            + " RESTART IDENTITY CASCADE"
        )


def timed_run(url: str, customer: uuid.UUID | None = None) -> tuple[float, dict[str, int]]:
    engine = create_engine(sqlalchemy_url(url))
    try:
        started = time.perf_counter()
        with transaction(engine) as session:
            summary = run_invoices(
                session,
                PERIOD,
                NOW,
                config=BillingSettings.of(Settings()),
                customer_id=customer,
                progress=ProgressBar("customers"),
            )
        seconds = time.perf_counter() - started  # including the commit
    finally:
        engine.dispose()
    if summary.failures:
        raise SystemExit(f"invoice run failed for {len(summary.failures)} customers")
    return seconds, {o.value: n for o, n in summary.counts.items()}


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def load(url: str, fleet: Fleet, label: str) -> dict[str, int]:
    conninfo = libpq_dsn(url)
    truncate(conninfo)
    write(conninfo, fleet)
    counts = {t: len(rows) for t, rows in fleet.rows.items()}
    say(f"{label}: wrote {counts}")
    # As the hourly job would: the months written get their partitions (rows move there).
    engine = create_engine(sqlalchemy_url(url))
    try:
        with engine.begin() as connection:
            retention.maintain(connection, int(time.time()), Settings().telemetry_retention_days)
    finally:
        engine.dispose()
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("ANALYZE")
    return counts


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scales", type=int, nargs="*", default=[1, 2, 4])
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--gpus", type=int, default=GPUS, help="at 1x")
    parser.add_argument("--customers", type=int, default=CUSTOMERS, help="at 1x")
    parser.add_argument("--big-gpus", type=int, default=BIG_GPUS, help="the big customer's")
    parser.add_argument("--no-big", action="store_true", help="skip the 3,000-GPU customer")
    args = parser.parse_args(argv)
    results: dict[str, Any] = {
        "gpus_1x": args.gpus,
        "customers_1x": args.customers,
        "period": PERIOD,
    }
    with scratch_database(server_from_environment(), "gpumeter_bench_invoices") as url:
        for scale in args.scales:
            label = f"{scale}x"
            gpus, customers = args.gpus * scale, args.customers * scale
            say(f"{label}: generating {gpus:,} GPUs, {customers:,} customers")
            counts = load(url, Fleet(gpus, customers, args.seed), label)
            seconds, outcome = timed_run(url)
            say(f"{label}: invoice run {seconds:.2f} s: {outcome}")
            results[label] = {"gpus": gpus, "seconds": round(seconds, 3), **outcome}
            results[label]["rows"] = counts
        if not args.no_big:
            label = f"{args.big_gpus} GPUs x {BIG_DAYS} days, one customer"
            big = Fleet(args.big_gpus, 1, args.seed, rental_gpus=BIG_RENTAL_GPUS, days=BIG_DAYS)
            counts = load(url, big, label)
            seconds, outcome = timed_run(url, big.customer_ids[0])
            say(f"{label}: invoice {seconds:.2f} s: {outcome}")
            results["big_customer"] = {
                "gpus": args.big_gpus,
                "seconds": round(seconds, 3),
                "rows": counts,
                **outcome,
            }
    results["targets"] = {"30k_gpus_s": TARGET_30K_S, "big_customer_s": TARGET_BIG_S}
    top = results.get(f"{max(args.scales, default=0)}x")
    if top is not None and top["gpus"] == 30_000:
        results["30k_gpus_met"] = top["seconds"] < TARGET_30K_S
    if results.get("big_customer", {}).get("gpus") == BIG_GPUS:  # the target's size
        results["big_customer_met"] = results["big_customer"]["seconds"] < TARGET_BIG_S
    print(json.dumps(results))
    missed = [k for k in ("30k_gpus_met", "big_customer_met") if results.get(k) is False]
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
