"""Late telemetry for a finalized period becomes an adjustment on the next invoice."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from fastapi import FastAPI
from sqlalchemy import Engine, text
from sqlalchemy.exc import IntegrityError

from app.billing.endpoints import clock
from app.core.db import transaction
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


def test_a_correction_larger_than_the_next_invoice_is_a_credit_note(
    console: Console, db: Engine, app: FastAPI, now: datetime
) -> None:
    """October ends the rental; November has nothing to charge. Late data shows GPU-B failed
    for 30 minutes in October: 1800 s x 2.49/h = 1.245 -> 1.25 comes back, and with nothing
    to offset it on, it is credit note CN-2026-000001 on October's invoice, with October's
    19 % tax: 0.2375 -> 0.24, total 1.49. November's invoice is zero, never negative."""
    world = october_with_failure(console, db, plan_fields={"bill_unmetered": True}, gpu_b_gap=GAP)
    rental = world.rental["id"]
    console.post(f"/v1/rentals/{rental}/end", {"end_at": "2026-11-01T00:00:00Z"}, 200)
    october = run_invoice(console, "2026-10")
    october = console.post(f"/v1/invoices/{october['id']}/finalize", {}, 200)
    write_telemetry(
        db,
        "GPU-B",
        [
            ("2026-10-20T00:00:00", "2026-10-20T00:30:00", "failed"),
            ("2026-10-20T00:30:00", "2026-10-20T01:00:00", "healthy"),
        ],
    )
    app.dependency_overrides[clock] = lambda: datetime(2026, 12, 1, 7, tzinfo=UTC)
    november = run_invoice(console, "2026-11")
    assert _lines(november) == [
        ("adjustment", None, "-1.25", "2026-10"),
        ("credit_note", None, "1.25", "2026-10"),
        ("tax", None, "0.00", None),
    ]
    assert november["lines"][1]["adjusts_invoice_id"] == october["id"]
    assert november["total"] == "0.00"
    customer = world.customer["id"]
    assert get(console, f"/v1/customers/{customer}/credit-notes")["items"] == []  # drafts: none

    final = console.post(f"/v1/invoices/{november['id']}/finalize", {}, 200)
    [note] = get(console, f"/v1/customers/{customer}/credit-notes")["items"]
    assert (note["number"], note["invoice_id"], note["issued_with_invoice_id"]) == (
        "CN-2026-000001",
        october["id"],
        final["id"],
    )
    assert (note["amount"], note["tax_rate"], note["tax"], note["total"]) == (
        "1.25",
        "0.19",
        "0.24",
        "1.49",
    )
    assert get(console, f"/v1/invoices/{october['id']}/credit-notes")["items"] == [note]
    [issued] = get(console, "/v1/events?type=credit_note.issued")["items"]
    assert (issued["subject"], issued["data"]["total"]) == (f"credit_note/{note['id']}", "1.49")
    # Voiding November would issue the same correction twice: refused.
    console.post(f"/v1/invoices/{final['id']}/void", {"reason": "x"}, 409)
    with transaction(db) as session, pytest.raises(IntegrityError, match="immutable"):
        session.execute(text("UPDATE credit_notes SET total = 0"))
    with transaction(db) as session, pytest.raises(IntegrityError, match="immutable"):
        session.execute(text("DELETE FROM credit_notes"))


def test_a_price_added_for_a_finalized_period_is_an_adjustment(
    console: Console, db: Engine, app: FastAPI, now: datetime
) -> None:
    """October billed at 2.49: 2,675,550 s -> 1850.59. A price of 1.99 effective 20 Oct is
    added after finalization: 1,638,750 s x 2.49 = 1133.47 and 1,036,800 s x 1.99 = 573.12,
    1706.59 in all, so November corrects October by -144.00."""
    world = october_with_failure(console, db)
    october = run_invoice(console, "2026-10")
    console.post(f"/v1/invoices/{october['id']}/finalize", {}, 200)
    price = {"gpu_model": "H100", "price_per_hour": "1.99", "effective_from": "2026-10-20T00:00Z"}
    console.post(f"/v1/plans/{world.plan['id']}/prices", price)
    november = run_invoice(console, "2026-11")
    adjustment = next(x for x in november["lines"] if x["kind"] == "adjustment")
    assert (adjustment["amount"], adjustment["adjusts_invoice_id"]) == ("-144.00", october["id"])
    assert adjustment["evidence"]["rerated"] == "1706.59"


def test_maintenance_recorded_afterwards_is_credited_on_the_next_invoice(
    console: Console, db: Engine, app: FastAPI, now: datetime
) -> None:
    """An hour of GPU-B recorded as maintenance after October was finalized: 3,600 s fewer
    billable, 2,671,950 s x 2.49 = 1848.10, so November corrects October by -2.49."""
    world = october_with_failure(console, db)
    october = run_invoice(console, "2026-10")
    console.post(f"/v1/invoices/{october['id']}/finalize", {}, 200)
    window = {"start_at": "2026-10-25T10:00:00Z", "end_at": "2026-10-25T11:00:00Z"}
    recorded = console.post("/v1/gpus/GPU-B/maintenance", {**window, "reason": "PSU swap"}, 201)
    assert recorded["rentals"] == [world.rental["id"]]
    november = run_invoice(console, "2026-11")
    adjustment = next(x for x in november["lines"] if x["kind"] == "adjustment")
    assert (adjustment["amount"], adjustment["evidence"]["rerated"]) == ("-2.49", "1848.10")
    assert adjustment["evidence"]["buckets_s"]["maintenance"] == 3600
