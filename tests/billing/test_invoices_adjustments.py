"""Late telemetry for a finalized period becomes an adjustment on the next invoice."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fastapi import FastAPI
from sqlalchemy import Engine

from app.billing.endpoints import clock
from tests.billing.world import get, october_with_failure, run_invoice, write_telemetry
from tests.harness import Console

GAP = ("2026-10-20T00:00:00", "2026-10-20T01:00:00")


def _lines(invoice: dict[str, Any]) -> list[tuple[str, int | None, str, str | None]]:
    return [(x["kind"], x["seconds"], x["amount"], x["adjusts_period"]) for x in invoice["lines"]]


def test_late_october_failure_is_credited_on_november(
    console: Console, db: Engine, app: FastAPI, now: datetime
) -> None:
    # The plan bills unmetered seconds, so October bills GPU-B's hour without telemetry.
    october_with_failure(console, db, plan_fields={"bill_unmetered": True}, gpu_b_gap=GAP)
    october = run_invoice(console, "2026-10")
    assert october["subtotal"] == "1850.59"  # 2,678,400 s charged, -1.95 and -0.02 credited
    console.post(f"/v1/invoices/{october['id']}/finalize", {}, 200)

    # The spooled hour arrives after finalization: GPU-B had failed for its first 30 minutes.
    write_telemetry(
        db,
        "GPU-B",
        [
            ("2026-10-20T00:00:00", "2026-10-20T00:30:00", "failed"),
            ("2026-10-20T00:30:00", "2026-10-20T01:00:00", "healthy"),
        ],
    )
    november = run_invoice(console, "2026-11")
    assert _lines(november) == [
        ("charge", 2_592_000, "1792.80", None),  # 30 days x 2.49/h
        ("adjustment", None, "-1.25", "2026-10"),  # 1800 s failed: 1.245 -> 1.25 credited
        ("voucher", None, "-277.59", None),  # October's 15 % tier voucher
        ("tax", None, "287.65", None),  # 19 % of 1513.96 = 287.6524
    ]
    adjustment = november["lines"][1]
    assert adjustment["adjusts_invoice_id"] == october["id"]
    assert adjustment["evidence"]["billed"] == "1850.59"
    assert adjustment["evidence"]["rerated"] == "1849.34"
    assert november["total"] == "1801.61"

    # Idempotent: the same draft again, and October itself never changes.
    assert run_invoice(console, "2026-11") | {"generated_at": None} == november | {
        "generated_at": None
    }
    assert get(console, f"/v1/invoices/{october['id']}")["total"] == october["total"]

    # Once November (with the adjustment) is finalized, December bills October no more.
    console.post(f"/v1/invoices/{november['id']}/finalize", {"force": True}, 200)
    app.dependency_overrides[clock] = lambda: datetime(2026, 12, 10, tzinfo=UTC)
    december = run_invoice(console, "2026-12")
    assert "adjustment" not in [x["kind"] for x in december["lines"]]
