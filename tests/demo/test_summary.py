"""The demo's closing summary counts the live invoices only."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from app.demo.summary import summarise


def _invoice(status: str, total: str, seconds: int) -> dict[str, Any]:
    line = {"kind": "charge", "seconds": seconds, "amount": total, "gpu_uuid": "GPU-A"}
    return {"status": status, "total": total, "lines": [line]}


def test_a_void_invoice_and_its_replacement_count_once() -> None:
    """Acme's November voided and run again, beside Beta's: the void one is left out."""
    invoices = [
        _invoice("void", "5989.84", 3_600_000),
        _invoice("finalized", "5989.84", 3_600_000),
        _invoice("draft", "12.34", 36_000),
    ]
    summary = summarise(invoices, "2026-11")
    assert summary.statuses == ["finalized", "draft"]
    assert summary.totals == Decimal("6002.18")
    assert summary.billed_hours == 1010.0
    assert "2 invoices (draft/finalized)" in summary.line()
