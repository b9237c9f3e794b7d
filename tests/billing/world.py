"""A small world for the DB-level invoice tests, built through the console API.

October 2026 (UTC): customer "Acme" rents one H100 on plan "on-demand" (2.49/h, tiers 7 d 5 %,
30 d 15 %) from Oct 1 for the whole month. GPU-A fails at 10 Oct 12:00 for 47 minutes
(XID 79); the rental is migrated to GPU-B, resuming 30 s after the failure ended.
Telemetry is written with the metering package's own segment writer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Engine

from app.core.db import transaction
from app.metering.repository import write_segments
from app.metering.segments import Span
from tests.harness import Console

TIERS = [{"min_days": 7, "percent": "5"}, {"min_days": 30, "percent": "15"}]
FAILURE_EVIDENCE = {"event_id": "ev-79", "rule": "xid", "code": 79}


def ts(text: str) -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp())


def write_telemetry(db: Engine, gpu: str, runs: Sequence[tuple[str, str, str]]) -> None:
    """Segments of one GPU: (start, end, state) with ISO times in UTC."""
    spans = [
        (gpu, Span(ts(a), ts(b), state, FAILURE_EVIDENCE if state == "failed" else None))
        for a, b, state in runs
    ]
    with transaction(db) as session:
        write_segments(session, spans, [])


def get(console: Console, path: str) -> Any:
    response = console.client.get(path, headers=console.headers)
    assert response.status_code == 200, response.text
    return response.json()


def run_invoice(console: Console, period: str) -> dict[str, Any]:
    """Run ``period`` for every customer and read back the one invoice it writes."""
    [invoice_id] = console.post("/v1/invoices/runs", {"period": period}, 200)["invoice_ids"]
    return get(console, f"/v1/invoices/{invoice_id}")


@dataclass
class World:
    customer: dict[str, Any]
    plan: dict[str, Any]
    rental: dict[str, Any]


def october_with_failure(
    console: Console,
    db: Engine,
    *,
    plan_fields: dict[str, Any] | None = None,
    gpu_b_gap: tuple[str, str] | None = None,
) -> World:
    """The world above; ``gpu_b_gap`` leaves GPU-B without telemetry over [start, end)."""
    acme = console.customer("Acme", tax_rate="0.19")
    plan = console.plan("on-demand", price="2.49", voucher_tiers=TIERS, **(plan_fields or {}))
    node = console.node()["node"]
    for gpu in ("GPU-A", "GPU-B"):
        console.gpu(node["id"], gpu)
    rental = console.rental(acme["id"], plan["id"], start_at="2026-10-01T00:00:00Z")
    console.assign(rental["id"], "GPU-A", "2026-10-01T00:00:00Z")
    # Closes GPU-A's assignment at failed_at and opens GPU-B's at resumed_at.
    console.post(
        f"/v1/rentals/{rental['id']}/migrations",
        {
            "from_gpu_uuid": "GPU-A",
            "to_gpu_uuid": "GPU-B",
            "failed_at": "2026-10-10T12:47:00Z",
            "resumed_at": "2026-10-10T12:47:30Z",
            "reason": "XID 79",
        },
    )
    write_telemetry(
        db,
        "GPU-A",
        [
            ("2026-10-01T00:00:00", "2026-10-10T12:00:00", "healthy"),
            ("2026-10-10T12:00:00", "2026-10-10T12:47:00", "failed"),
        ],
    )
    gap = gpu_b_gap or ("2026-11-30T00:00:00", "2026-11-30T00:00:00")
    b_runs = [
        ("2026-10-10T12:47:30", gap[0], "healthy"),
        (gap[1], "2026-11-30T00:00:00", "healthy"),
    ]
    write_telemetry(db, "GPU-B", [run for run in b_runs if run[0] < run[1]])
    return World(acme, plan, rental)
