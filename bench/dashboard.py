"""Dashboard benchmark: server-side time of each page for a customer with 64 GPUs over a month.

Seeds October 2026 in a fresh database (created and dropped on GPUMETER_DATABASE_URL's server):
one 64-GPU rental for the whole month, every GPU with a full month of state segments and minute
metrics (busy and idle hours), four GPUs failing for 47 min with a migration to a spare, and the
month's finalized invoice. Then times each page in-process (ASGI, no network) as the customer:
one warm-up, then ``--runs`` requests; prints a line per page and a final JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from datetime import datetime

from fastapi.testclient import TestClient
from sqlalchemy import create_engine

from app.auth.models import KeyKind
from app.auth.service import issue_key
from app.core.db import transaction
from app.core.epoch import from_epoch
from app.core.scratch_db import scratch_database, server_from_environment
from app.main import create_app
from app.metering import packing
from app.metering.repository import write_metric_rows, write_segments
from app.metering.segments import Span
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


def seed(client: TestClient, admin: str, engine_url: str) -> dict[str, str]:
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
    gpus = [f"GPU-{i:03d}" for i in range(GPUS)]
    spares = [f"GPU-S{i}" for i in range(len(FAILED))]
    for gpu in gpus + spares:
        post("/v1/gpus", {"uuid": gpu, "node_id": node["id"], "model": "H100"})
    rental = post(
        "/v1/rentals",
        {
            "customer_id": customer["id"],
            "plan_id": plan["id"],
            "gpu_model": "H100",
            "gpu_count": GPUS,
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
        if i in FAILED:
            n = FAILED.index(i)
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="timed requests per page")
    args = parser.parse_args()
    with scratch_database(server_from_environment(), "gpumeter_bench_dashboard") as url:
        engine = create_engine(sqlalchemy_url(url))
        with transaction(engine) as session:
            admin = issue_key(session, KeyKind.ADMIN, "bench").secret
        with TestClient(create_app(engine), base_url="https://testserver") as client:
            began = time.perf_counter()
            ids = seed(client, admin, url)
            print(f"seeded in {time.perf_counter() - began:.1f} s")
            results = time_pages(client, ids, args.runs)
        engine.dispose()
        print(json.dumps({"gpus": GPUS, "period": PERIOD, "runs": args.runs, "pages": results}))
    return 0


def time_pages(client: TestClient, ids: dict[str, str], runs: int) -> dict[str, dict[str, float]]:
    pages = {
        "overview": f"/dashboard?period={PERIOD}",
        "rental": f"/dashboard/rentals/{ids['rental']}?period={PERIOD}",
        "invoices": "/dashboard/invoices",
        "invoice": f"/dashboard/invoices/{ids['invoice']}",
        "invoice_pdf": f"/dashboard/invoices/{ids['invoice']}/pdf",
        "what_if": f"/dashboard/what-if?period={PERIOD}",
        "costs": f"/dashboard/costs?period={PERIOD}",
        "usage_csv": f"/dashboard/exports/usage.csv?period={PERIOD}",
        "focus_csv": f"/dashboard/exports/focus.csv?period={PERIOD}",
        # The JSON the overview shows, for comparison: the overview's floor.
        "usage_api": f"/v1/customers/{ids['customer']}/usage?period={PERIOD}",
    }
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
        print(
            f"{name:12s} median {results[name]['median_ms']:7.1f} ms  "
            f"max {results[name]['max_ms']:7.1f} ms  {len(response.content):8d} B"
        )
    return results


if __name__ == "__main__":
    raise SystemExit(main())
