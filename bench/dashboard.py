"""Dashboard benchmark: server-side time of each page, for a 64-GPU month and for the seed's
3,000-GPU customer over a 60-day rental.

Each case seeds a fresh database (created and dropped on GPUMETER_DATABASE_URL's server), then
times each page in-process (ASGI, no network) as the customer: one warm-up, then ``--runs``
requests; prints a line per page, the targets with pass/fail, and a final JSON line.

* small: October 2026, one 64-GPU rental for the whole month, every GPU with a full month of
  state segments and minute metrics (busy and idle hours), four GPUs failing for 47 min with a
  migration to a spare, and the month's finalized invoice. Target: every page < 300 ms.
* big: one 3,000-GPU A100 rental from 2026-10-01 for 60 days, read on 2026-11-29 12:30 UTC
  (November to date: 28 closed days and the open one, half an hour into its hour). Nodes,
  GPUs, the rental and its assignments are inserted in bulk (as ``gpumeter simulate`` does);
  segments through the metering repository's writer: each GPU healthy, 0.72 % of GPU-days
  with a 47-min failure (~1,300), 20 of them moved to a spare. Minute metrics only for the
  open day's hours (a month of them would be 2 M rows): closed days' idle seconds are what
  their rollups hold. The first read stores the rollups of the closed days and of the open
  day to 12:00 (as the hourly job would have) and is timed on its own; the pages are then
  timed in steady state (the table analyzed, as autovacuum leaves it).
  Targets: overview and rental page < 500 ms, what-if, the invoice PDF and the FOCUS CSV < 1 s.

``--gpus`` and ``--big-gpus`` size the two rentals (a smaller small rental keeps the failures
among its GPUs); the targets are for the sizes above. The tests run a tiny configuration
(``--gpus 8 --big-gpus 16 --runs 1``) so that a bench that stops running fails CI.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
import tracemalloc
import uuid
from datetime import datetime

from fastapi.testclient import TestClient
from sqlalchemy import Engine, create_engine, insert, text

from app.auth.models import KeyKind
from app.auth.service import issue_key
from app.billing.endpoints import clock
from app.core.db import transaction
from app.core.epoch import from_epoch
from app.core.scratch_db import scratch_database, server_from_environment
from app.fleet.models import Gpu, Node
from app.main import create_app
from app.metering import packing
from app.metering.repository import write_metric_rows, write_segments
from app.metering.segments import Span
from app.rentals.models import GpuAssignment, Migration, Rental
from app.settings import sqlalchemy_url
from metering_agent.protocol import GpuState, UsageRecord

GPUS = 64
START, END = "2026-10-01T00:00:00Z", "2026-11-01T00:00:00Z"
PERIOD = "2026-10"
FAILED = [3, 17, 40, 58]  # GPU indexes that fail once, on different days


def ts(text: str) -> int:
    return int(datetime.fromisoformat(text).timestamp())


def hour_row(util: float) -> bytes:
    """One packed hour of minute metrics; the slots are hour-relative, so any hour can reuse it."""
    records = [
        UsageRecord(
            "g",
            "H100",
            m * 60,
            m * 60 + 60,
            GpuState.HEALTHY,
            60,
            util,
            int(util),
            energy_j=60 * (120 + 5.8 * util),
            power_max_w=700.0,
        )
        for m in range(60)
    ]
    return packing.add_records(packing.EMPTY_ROW, records)


def seed(client: TestClient, admin: str, engine_url: str, gpu_count: int) -> dict[str, str]:
    h = {"Authorization": f"Bearer {admin}"}

    def post(path: str, body: dict, status: int = 201) -> dict:
        response = client.post(path, json=body, headers=h)
        assert response.status_code == status, response.text
        return response.json()

    customer = post(
        "/v1/customers",
        {"name": "Bench", "currency": "EUR", "billing_timezone": "UTC", "tax_rate": "0.19"},
    )
    prices = [
        {"gpu_model": "H100", "price_per_hour": "2.49", "effective_from": "2026-01-01T00:00:00Z"}
    ]
    plan = post("/v1/plans", {"name": "bench", "currency": "EUR", "prices": prices})
    node = post("/v1/nodes", {"hostname": "bench-1", "datacenter": "fra1"})["node"]
    gpus = [f"GPU-{i:03d}" for i in range(gpu_count)]
    failed_gpus = [i for i in FAILED if i < gpu_count]  # a smaller rental: fewer fail
    spares = [f"GPU-S{i}" for i in range(len(failed_gpus))]
    for gpu in gpus + spares:
        post("/v1/gpus", {"uuid": gpu, "node_id": node["id"], "model": "H100"})
    rental = post(
        "/v1/rentals",
        {
            "customer_id": customer["id"],
            "plan_id": plan["id"],
            "gpu_model": "H100",
            "gpu_count": gpu_count,
            "start_at": START,
            "end_at": END,
        },
    )
    for gpu in gpus:
        post(f"/v1/rentals/{rental['id']}/assignments", {"gpu_uuid": gpu, "start_at": START})
    lo, hi = ts(START), ts(END)
    spans: list[tuple[str, Span]] = []
    rows: dict[tuple[str, int], tuple[bytes, int | None]] = {}
    busy, idle = hour_row(87.5), hour_row(0.0)
    for i, gpu in enumerate(gpus):
        end = hi
        if i in failed_gpus:
            n = failed_gpus.index(i)
            failed = lo + (3 + 7 * n) * 86_400
            spans += [
                (gpu, Span(lo, failed, "healthy")),
                (gpu, Span(failed, failed + 2820, "failed", {"code": 79, "rule": "xid"})),
            ]
            spans.append((spares[n], Span(failed + 2850, hi, "healthy")))
            post(
                f"/v1/rentals/{rental['id']}/migrations",
                {
                    "from_gpu_uuid": gpu,
                    "to_gpu_uuid": spares[n],
                    "failed_at": _iso(failed + 2820),
                    "resumed_at": _iso(failed + 2850),
                },
            )
            end = failed + 2820
        else:
            spans.append((gpu, Span(lo, hi, "healthy")))
        for hour in range(lo, end, 3600):
            rows[(gpu, hour)] = (idle if (hour // 3600) % 6 == 0 else busy, 81559)
    engine = create_engine(sqlalchemy_url(engine_url))
    with transaction(engine) as session:
        write_segments(session, spans, [])
        write_metric_rows(session, rows, closed=True)
    run = post(
        "/v1/invoices/runs",
        {"period": PERIOD, "customer_id": customer["id"], "finalize": True, "force": True},
        200,
    )
    key = post(f"/v1/customers/{customer['id']}/keys", {"name": "bench"})["key"]
    return {
        "customer": customer["id"],
        "rental": rental["id"],
        "invoice": run["invoice_ids"][0],
        "key": key,
    }


def _iso(second: int) -> str:
    return from_epoch(second).isoformat()


BIG_GPUS = 3000
BIG_START, BIG_DAYS = "2026-10-01T00:00:00Z", 60
BIG_NOW = "2026-11-29T12:30:00Z"
BIG_PERIOD = "2026-11"
BIG_MIGRATED = 20  # failures moved to a spare (rows in bulk); the rest recover in place
FAILURE_RATE = 0.0072  # per GPU-day
RECOVERY_S = 47 * 60
BIG_RUNS = 3  # at most, to stay within the bench's three minutes


def seed_big(
    client: TestClient, admin: str, engine_url: str, at: str, gpu_count: int
) -> dict[str, str]:
    h = {"Authorization": f"Bearer {admin}"}

    def post(path: str, body: dict, status: int = 201) -> dict:
        response = client.post(path, json=body, headers=h)
        assert response.status_code == status, response.text
        return response.json()

    customer = post("/v1/customers", {"name": "Flagship", "currency": "USD"})
    prices = [
        {
            "gpu_model": "A100",
            "price_per_hour": "2.80",
            "monthly_cap_per_gpu": "1900.00",
            "effective_from": "2026-01-01T00:00:00Z",
        }
    ]
    plan = post("/v1/plans", {"name": "flagship", "currency": "USD", "prices": prices})
    lo = ts(BIG_START)
    hi, now = lo + BIG_DAYS * 86_400, ts(at)
    rng = random.Random(0)
    gpus = [f"GPU-A{i:05d}" for i in range(gpu_count)]
    spares = [f"GPU-SP{i:03d}" for i in range(BIG_MIGRATED)]
    rental_id = uuid.uuid4()
    engine = create_engine(sqlalchemy_url(engine_url))
    with transaction(engine) as session:
        nodes = [
            {"id": uuid.uuid4(), "hostname": f"big-{n:04d}", "datacenter": "dc1"}
            for n in range(-(-(gpu_count + BIG_MIGRATED) // 8))
        ]
        session.execute(insert(Node), nodes)
        session.execute(
            insert(Gpu),
            [
                {"uuid": g, "node_id": nodes[i // 8]["id"], "model": "A100"}
                for i, g in enumerate(gpus + spares)
            ],
        )
        session.execute(
            insert(Rental),
            [
                {
                    "id": rental_id,
                    "customer_id": uuid.UUID(customer["id"]),
                    "plan_id": uuid.UUID(plan["id"]),
                    "gpu_model": "A100",
                    "gpu_count": gpu_count,
                    "start_at": from_epoch(lo),
                    "end_at": from_epoch(hi),
                }
            ],
        )
        spans, migrations = _big_history(gpus, spares, lo, now, rng)
        moved = {gpu: (spare, failed, resumed) for gpu, spare, failed, resumed in migrations}
        customer_id = uuid.UUID(customer["id"])

        def held(gpu: str, start: int, end: int) -> dict[str, object]:
            return {
                "rental_id": rental_id,
                "customer_id": customer_id,
                "gpu_uuid": gpu,
                "start_at": from_epoch(start),
                "end_at": from_epoch(end),
            }

        assignments = [held(g, lo, moved[g][1] if g in moved else hi) for g in gpus]
        assignments += [held(spare, resumed, hi) for spare, _, resumed in moved.values()]
        session.execute(insert(GpuAssignment), assignments)
        if migrations:
            session.execute(
                insert(Migration),
                [
                    {
                        "rental_id": rental_id,
                        "customer_id": customer_id,
                        "from_gpu_uuid": gpu,
                        "to_gpu_uuid": spare,
                        "failed_at": from_epoch(failed),
                        "resumed_at": from_epoch(resumed),
                        "reason": "xid 79",
                    }
                    for gpu, spare, failed, resumed in migrations
                ],
            )
        for chunk in range(0, len(spans), 20_000):
            write_segments(session, spans[chunk : chunk + 20_000], [])
        busy, idle = hour_row(87.5), hour_row(0.0)
        open_day = now - now % 86_400
        rows: dict[tuple[str, int], tuple[bytes, int | None]] = {
            (g, hour): (idle if (hour // 3600 + i) % 6 == 0 else busy, 81559)
            for i, g in enumerate(gpus)
            for hour in range(open_day, now, 3600)
        }
        write_metric_rows(session, rows, closed=True)
    engine.dispose()
    # October's invoice, so the exports (of an invoice) have one: 31 days of 3,000 GPUs.
    run = post(
        "/v1/invoices/runs",
        {"period": "2026-10", "customer_id": customer["id"], "finalize": True, "force": True},
        200,
    )
    key = post(f"/v1/customers/{customer['id']}/keys", {"name": "bench"})["key"]
    return {
        "customer": customer["id"],
        "rental": str(rental_id),
        "key": key,
        "export_period": "2026-10",
        "invoice": run["invoice_ids"][0],
    }


def _big_history(
    gpus: list[str], spares: list[str], lo: int, now: int, rng: random.Random
) -> tuple[list[tuple[str, Span]], list[tuple[str, str, int, int]]]:
    """Each GPU healthy from ``lo`` to ``now`` but for its failures (47 min each); the first
    ``BIG_MIGRATED`` failures move the rental to a spare 30 s after the GPU failed."""
    days = (now - lo) // 86_400
    spans: list[tuple[str, Span]] = []
    migrations: list[tuple[str, str, int, int]] = []
    for gpu in gpus:
        failures = sorted(
            lo + d * 86_400 + rng.randrange(3600, 80_000)
            for d in range(days)
            if rng.random() < FAILURE_RATE
        )
        if failures and len(migrations) < len(spares):
            failed = failures[0]
            spare = spares[len(migrations)]
            migrations.append((gpu, spare, failed, failed + 30))
            spans += [
                (gpu, Span(lo, failed, "healthy")),
                (gpu, Span(failed, failed + RECOVERY_S, "failed", {"code": 79, "rule": "xid"})),
                (spare, Span(failed + 30, now, "healthy")),
            ]
            continue
        cursor = lo
        for failed in failures:
            spans.append((gpu, Span(cursor, failed, "healthy")))
            evidence = {"code": 79, "rule": "xid"}
            spans.append((gpu, Span(failed, failed + RECOVERY_S, "failed", evidence)))
            cursor = failed + RECOVERY_S
        spans.append((gpu, Span(cursor, now, "healthy")))
    return spans, migrations


# Page -> target in ms, per case; pages without one are printed for information.
SMALL_TARGET_MS = 300.0
BIG_TARGETS_MS = {
    "overview": 500.0,
    "rental": 500.0,
    "what_if": 1000.0,
    "invoice_pdf": 1000.0,
    "focus_csv": 1000.0,
}
# Pages that read the invoice only: timing just these needs no rollups stored first.
INVOICE_PAGES = {"invoices", "invoice", "invoice_pdf", "usage_csv", "focus_csv"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="timed requests per page")
    parser.add_argument("--gpus", type=int, default=GPUS, help="the small case's rental")
    parser.add_argument("--big-gpus", type=int, default=BIG_GPUS, help="the big case's rental")
    parser.add_argument(
        "--case", choices=["small", "big", "both"], default="both", help="which customer"
    )
    parser.add_argument(
        "--big-now",
        default=BIG_NOW,
        help="when the big customer is read (ISO 8601, in November 2026; e.g. "
        "2026-11-29T23:30:00Z for the open day's longest stored span)",
    )
    parser.add_argument(
        "--pages",
        type=lambda text: set(text.split(",")),
        default=None,
        help="only these pages, comma-separated (e.g. invoice_pdf,focus_csv); default: all",
    )
    args = parser.parse_args()
    figures: dict[str, dict[str, dict[str, float]]] = {}
    checks: list[dict[str, object]] = []
    if args.case in ("small", "both"):
        figures["small"] = run_case("small", args.gpus, args.runs, args.big_now, args.pages)
        checks += [
            _check("small", page, r, SMALL_TARGET_MS)
            for page, r in figures["small"].items()
            if page != "usage_api"
        ]
    if args.case in ("big", "both"):
        figures["big"] = run_case("big", args.big_gpus, args.runs, args.big_now, args.pages)
        checks += [
            _check("big", p, figures["big"][p], t)
            for p, t in BIG_TARGETS_MS.items()
            if p in figures["big"]
        ]
    for c in checks:
        print(
            f"{c['case']:5s} {c['page']:12s} {c['median_ms']:8.1f} ms  target < "
            f"{c['target_ms']:6.0f} ms  {'pass' if c['pass'] else 'FAIL'}"
        )
    print(
        json.dumps(
            {
                "small": {"gpus": args.gpus, "period": PERIOD},
                "big": {
                    "gpus": args.big_gpus,
                    "days": BIG_DAYS,
                    "period": BIG_PERIOD,
                    "now": args.big_now,
                },
                "runs": args.runs,
                "pages": figures,
                "targets": checks,
                "pass": all(c["pass"] for c in checks),
            }
        )
    )
    return 0 if all(c["pass"] for c in checks) else 1


def _check(case: str, page: str, result: dict[str, float], target: float) -> dict[str, object]:
    median = result["median_ms"]
    return {
        "case": case,
        "page": page,
        "median_ms": median,
        "target_ms": target,
        "pass": median < target,
    }


def run_case(
    case: str, gpus: int, runs: int, big_now: str, only: set[str] | None = None
) -> dict[str, dict[str, float]]:
    with scratch_database(server_from_environment(), f"gpumeter_bench_dashboard_{case}") as url:
        engine = create_engine(sqlalchemy_url(url))
        with transaction(engine) as session:
            admin = issue_key(session, KeyKind.ADMIN, "bench").secret
        app = create_app(engine)
        if case == "big":
            pinned = datetime.fromisoformat(big_now)
            app.dependency_overrides[clock] = lambda: pinned
        with TestClient(app, base_url="https://testserver") as client:
            began = time.perf_counter()
            if case == "small":
                ids = seed(client, admin, url, gpus)
            else:
                ids = seed_big(client, admin, url, big_now, gpus)
            print(f"{case}: seeded in {time.perf_counter() - began:.1f} s")
            if case == "small":
                results = time_pages(client, ids, PERIOD, runs, only)
            elif only is not None and only <= INVOICE_PAGES:
                results = time_pages(client, ids, BIG_PERIOD, min(runs, BIG_RUNS), only)
            else:  # the big rental page alone takes seconds a request before rollups
                _store_rollups(client, engine, ids)
                results = time_pages(client, ids, BIG_PERIOD, min(runs, BIG_RUNS), only)
                results["open_span_refresh"] = _time_open_span_refresh(client, engine, ids, big_now)
        engine.dispose()
    return results


def _store_rollups(client: TestClient, engine: Engine, ids: dict[str, str]) -> None:
    """The first read stores the closed days' and hours' rollups (~90,000 rows here); ANALYZE
    then does what autovacuum does soon after such a write. Timed right after the write, the
    reads plan against an empty table's statistics (sorts spilled to disk: ~+250 ms a read)."""
    path = f"/v1/customers/{ids['customer']}/usage?period={BIG_PERIOD}"
    began = time.perf_counter()
    assert client.get(path, headers={"Authorization": f"Bearer {ids['key']}"}).status_code == 200
    seconds = time.perf_counter() - began
    print(f"big: first read, storing the closed spans' rollups: {seconds:.1f} s")
    with engine.connect() as connection:
        connection.execute(text("ANALYZE usage_rollups"))
        connection.commit()


def _time_open_span_refresh(
    client: TestClient, engine: Engine, ids: dict[str, str], now: str
) -> dict[str, float]:
    """One overview that must store the open day's span itself (what a read in the minutes
    between an hour's grace and the hourly job does): the span's row is dropped first."""
    open_day = ts(now) - ts(now) % 86_400  # the customer bills in UTC
    with engine.connect() as connection:
        connection.execute(text("DELETE FROM usage_rollup_spans WHERE start = :d"), {"d": open_day})
        connection.commit()
    headers = {"Authorization": f"Bearer {ids['key']}"}
    began = time.perf_counter()
    response = client.get(f"/dashboard?period={BIG_PERIOD}", headers=headers)
    elapsed = round((time.perf_counter() - began) * 1000, 1)
    assert response.status_code == 200
    print(f"overview storing the open span itself: {elapsed:.1f} ms")
    return {"median_ms": elapsed, "max_ms": elapsed, "bytes": len(response.content)}


def time_pages(
    client: TestClient, ids: dict[str, str], period: str, runs: int, only: set[str] | None = None
) -> dict[str, dict[str, float]]:
    exported = ids.get("export_period", period)
    pages = {
        "overview": f"/dashboard?period={period}",
        "rental": f"/dashboard/rentals/{ids['rental']}?period={period}",
        "invoices": "/dashboard/invoices",
        "what_if": f"/dashboard/what-if?period={period}",
        "costs": f"/dashboard/costs?period={period}",
        # The costs page's heaviest grouping: a rental's days split by its GPUs' datacenters.
        "costs_by_dc": f"/dashboard/costs?period={period}&group_by=datacenter",
        "usage_csv": f"/dashboard/exports/usage.csv?period={exported}",
        "focus_csv": f"/dashboard/exports/focus.csv?period={exported}",
        # The JSON the overview shows, for comparison: the overview's floor.
        "usage_api": f"/v1/customers/{ids['customer']}/usage?period={period}",
    }
    if "invoice" in ids:
        pages["invoice"] = f"/dashboard/invoices/{ids['invoice']}"
        pages["invoice_pdf"] = f"/dashboard/invoices/{ids['invoice']}/pdf"
    if only is not None:
        pages = {name: path for name, path in pages.items() if name in only}
    headers = {"Authorization": f"Bearer {ids['key']}"}
    results = {}
    for name, path in pages.items():
        assert client.get(path, headers=headers).status_code == 200, path  # warm-up
        times = []
        for _ in range(runs):
            began = time.perf_counter()
            response = client.get(path, headers=headers)
            times.append((time.perf_counter() - began) * 1000)
            assert response.status_code == 200
        results[name] = {
            "median_ms": round(statistics.median(times), 1),
            "max_ms": round(max(times), 1),
            "bytes": len(response.content),
        }
        if name.endswith("_csv"):
            results[name]["peak_mib"] = _streamed_peak_mib(client, path, headers)
        print(
            f"{name:12s} median {results[name]['median_ms']:7.1f} ms  "
            f"max {results[name]['max_ms']:7.1f} ms  {len(response.content):8d} B"
        )
    return results


def _streamed_peak_mib(client: TestClient, path: str, headers: dict[str, str]) -> float:
    """Peak Python memory while an export streams (chunks read and dropped): flat when the
    server streams, the file's size when it builds it first."""
    tracemalloc.start()
    with client.stream("GET", path, headers=headers) as response:
        for _ in response.iter_bytes():
            pass
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return round(peak / 2**20, 1)


if __name__ == "__main__":
    raise SystemExit(main())
