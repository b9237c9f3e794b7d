"""How an invoice reads, in one wording for the invoice HTML, the dashboard and the PDF.

Plain text: each renderer escapes it for its medium and formats times in its own zone.
Customer text names GPUs, times, XIDs and reasons, never an internal row id.

API:
    label(kind) -> str
    line_facts(line, when, rental=str) -> list[str]
    credits_summary(lines) -> CreditsSummary
    percent(rate) -> str
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from decimal import ROUND_HALF_UP, Decimal

from app.billing.core.lines import CREDIT_KINDS, LineKind
from app.billing.schemas import InvoiceLineRead

KIND_LABELS = {
    "charge": "GPU time",
    "failure_credit": "Failure credit",
    "migration_credit": "Migration credit",
    "degraded_credit": "Degraded-time credit",
    "stall_credit": "Stalled-job credit",
    "cap": "Monthly cap",
    "adjustment": "Adjustment (late data)",
    "credit_note": "Issued as a credit note",
    "voucher": "Voucher",
    "tax": "Tax",
    "prepaid_balance": "Prepaid balance applied",
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


@dataclass(frozen=True)
class CreditsSummary:
    credited_s: int
    incidents: int

    @property
    def gpu_hours(self) -> Decimal:
        return (Decimal(self.credited_s) / 3600).quantize(Decimal("0.01"), ROUND_HALF_UP)

    @property
    def text(self) -> str:
        incidents = "incident" if self.incidents == 1 else "incidents"
        return f"{self.gpu_hours} GPU-hours credited for {self.incidents} {incidents}"


def credits_summary(lines: Iterable[InvoiceLineRead]) -> CreditsSummary:
    """Credited seconds and incidents: credit lines of one rental on one GPU that touch (a
    failure and the migration window after it; one incident split at a price change) are
    one incident. A stall credit is the other GPUs' share of the incident of the GPU that
    stalled the job: its seconds count, it is no incident of its own."""
    credits = sorted(
        (x for x in lines if x.kind in CREDIT_KINDS and x.start_at and x.end_at),
        key=lambda x: (str(x.rental_id), x.gpu_uuid or "", x.start_at),
    )
    incidents, last = 0, None
    for x in credits:
        if x.kind == LineKind.STALL_CREDIT:
            continue
        key = (x.rental_id, x.gpu_uuid)
        if last is None or last[0] != key or last[1] != x.start_at:
            incidents += 1
        last = (key, x.end_at)
    return CreditsSummary(sum(x.seconds or 0 for x in credits), incidents)


def percent(rate: Decimal | str) -> str:
    """A tax rate as a percentage: 0.19 -> "19 %", 0.075 -> "7.5 %"."""
    value = (Decimal(rate) * 100).normalize()
    return f"{value:f} %"
