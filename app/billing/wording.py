"""How an invoice line reads, in one wording for the invoice HTML, the dashboard and the PDF.

Plain text: each renderer escapes it for its medium and formats times in its own zone.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime

from app.billing.schemas import InvoiceLineRead

KIND_LABELS = {
    "charge": "GPU time",
    "failure_credit": "Failure credit",
    "migration_credit": "Migration credit",
    "degraded_credit": "Degraded-time credit",
    "cap": "Monthly cap",
    "adjustment": "Adjustment (late data)",
    "voucher": "Voucher",
    "tax": "Tax",
}


def label(kind: str) -> str:
    return KIND_LABELS.get(kind, kind)


def line_facts(
    line: InvoiceLineRead,
    when: Callable[[datetime], str],
    rental: Callable[[uuid.UUID], str] = str,
) -> list[str]:
    """What the line is about, in reading order: GPU model, rental, GPU, interval, voucher, and
    the earlier period an adjustment corrects. Evidence is left to the renderer."""
    facts = []
    if line.gpu_model:
        facts.append(line.gpu_model)
    if line.rental_id:
        facts.append(f"rental {rental(line.rental_id)}")
    if line.gpu_uuid:
        facts.append(f"GPU {line.gpu_uuid}")
    if line.start_at and line.end_at:
        facts.append(f"{when(line.start_at)} to {when(line.end_at)}")
    if line.voucher_id:
        facts.append(f"voucher {line.voucher_id}")
    if line.adjusts_period:
        facts.append(f"corrects {line.adjusts_period}")
    return facts
