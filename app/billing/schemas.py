"""Invoice, voucher, usage and what-if bodies. Money is a string at the currency's minor unit
("1852.56", "151"), rates are plain decimal strings; never a JSON float."""

from __future__ import annotations

import uuid
from datetime import datetime
from decimal import Decimal
from typing import Any

from pydantic import Field

from app.billing.core.evidence import xid_of
from app.billing.core.lines import CREDIT_KINDS
from app.billing.loader import PERIOD_PATTERN
from app.billing.models import (
    CreditNote,
    Invoice,
    InvoiceLineRow,
    InvoiceStatus,
    VoucherEntryRow,
)
from app.core.money import round_money
from app.core.schemas import Amount, Instant, Schema

Period = str  # "YYYY-MM", validated by PERIOD_PATTERN where it is input


def money(amount: Decimal, currency: str) -> str:
    """An exact stored amount (already rounded once) written at the currency's minor unit."""
    return str(round_money(amount, currency))


def plain(value: Decimal | None) -> str | None:
    """A rate without trailing zeros and never in exponent form: 2.4900000000 -> "2.49"."""
    return None if value is None else f"{value.normalize():f}"


class InvoiceLineRead(Schema):
    position: int
    kind: str
    amount: str
    rental_id: uuid.UUID | None
    gpu_model: str | None
    gpu_uuid: str | None
    start_at: datetime | None
    end_at: datetime | None
    seconds: int | None
    rate: str | None = Field(description="Price per GPU-hour; the tax rate on the tax line.")
    voucher_id: str | None
    evidence: dict[str, Any] | None
    code: int | None = Field(
        default=None, description="Credit lines: the NVIDIA XID of the failure credited."
    )
    adjusts_invoice_id: uuid.UUID | None
    adjusts_period: str | None

    @classmethod
    def of(cls, line: InvoiceLineRow, currency: str) -> InvoiceLineRead:

        return cls(
            position=line.position,
            kind=line.kind,
            amount=money(line.amount, currency),
            rental_id=line.rental_id,
            gpu_model=line.gpu_model,
            gpu_uuid=line.gpu_uuid,
            start_at=line.start_at,
            end_at=line.end_at,
            seconds=line.seconds,
            rate=plain(line.rate),
            voucher_id=line.voucher_id,
            evidence=line.evidence,
            code=xid_of(line.evidence) if line.kind in CREDIT_KINDS else None,
            adjusts_invoice_id=line.adjusts_invoice_id,
            adjusts_period=line.adjusts_period,
        )


class InvoiceSummary(Schema):
    id: uuid.UUID
    customer_id: uuid.UUID
    number: str | None
    period: str
    period_start: datetime
    period_end: datetime
    timezone: str
    currency: str
    status: InvoiceStatus
    subtotal: str = Field(description="Usage, cap, corrections and vouchers: before tax.")
    tax_rate: str
    tax: str
    total: str = Field(
        description="Subtotal + tax: the invoice's total, before the prepaid balance (Stripe's "
        "total)."
    )
    amount_due: str = Field(
        description="What is left to pay: the total less the prepaid balance applied (Stripe's "
        "amount_due); what Stripe collects."
    )
    generated_at: datetime
    finalized_at: datetime | None
    due_at: datetime | None = Field(description="Finalization + the customer's payment terms.")
    paid_at: datetime | None
    voided_at: datetime | None
    void_reason: str | None
    stripe_invoice_id: str | None
    stripe_hosted_url: str | None
    stripe_status: str | None

    @classmethod
    def of(cls, invoice: Invoice) -> InvoiceSummary:
        currency = invoice.currency
        computed = ("lines", "amount_due")
        fields = {name: getattr(invoice, name) for name in cls.model_fields if name not in computed}
        return cls(
            **{
                **fields,
                "subtotal": money(invoice.subtotal, currency),
                "tax": money(invoice.tax, currency),
                "total": money(invoice.subtotal + invoice.tax, currency),
                "amount_due": money(invoice.total, currency),
                "tax_rate": plain(invoice.tax_rate),
            }
        )


class InvoiceRead(InvoiceSummary):
    lines: list[InvoiceLineRead]

    @classmethod
    def of(cls, invoice: Invoice) -> InvoiceRead:
        summary = InvoiceSummary.of(invoice).model_dump()
        lines = [InvoiceLineRead.of(line, invoice.currency) for line in invoice.lines]
        return cls(**summary, lines=lines)


class RunCreate(Schema):
    period: Period = Field(pattern=PERIOD_PATTERN, examples=["2026-10"])
    customer_id: uuid.UUID | None = None
    finalize: bool = False
    force: bool = Field(default=False, description="Finalize before the grace time passed.")
    as_of: Instant | None = Field(
        default=None,
        description="Run as of this past time (re-runs, backfills): grace, voucher validity, "
        "generated_at and finalized_at are judged then. Default: now.",
    )


class RunFailure(Schema):
    customer_id: uuid.UUID
    msg: str


class RunRead(Schema):
    period: str
    customers: int
    counts: dict[str, int]
    failures: list[RunFailure]
    invoice_ids: list[uuid.UUID]
    seconds: float


class FinalizeBody(Schema):
    force: bool = Field(default=False, description="Finalize before the grace time passed.")


class VoidBody(Schema):
    reason: str = Field(min_length=1, max_length=500)


class PaidBody(Schema):
    paid_at: Instant | None = Field(default=None, description="Default: now.")


class VoucherGrant(Schema):
    amount: Amount
    validity_days: int = Field(default=90, ge=1, le=3660)
    reason: str = Field(min_length=1, max_length=500)


class VoucherEntryRead(Schema):
    voucher_id: str
    kind: str
    amount: str
    at: datetime
    expires_at: datetime | None
    source: str | None
    reason: str
    invoice_id: uuid.UUID | None

    @classmethod
    def of(cls, entry: VoucherEntryRow) -> VoucherEntryRead:
        fields = {name: getattr(entry, name) for name in cls.model_fields}
        return cls(**{**fields, "amount": money(entry.amount, entry.currency)})


class OpenVoucherRead(Schema):
    voucher_id: str
    expires_at: datetime
    remaining: str


class VoucherLedgerRead(Schema):
    customer_id: uuid.UUID
    currency: str
    balance: str = Field(description="Issued - applied - expired, over the whole ledger.")
    usable: str = Field(description="What is left of vouchers not expired now.")
    open: list[OpenVoucherRead]
    entries: list[VoucherEntryRead]


class EffectiveRead(Schema):
    rented_s: int
    credited_s: int
    idle_s: int
    unmeasured_s: int = Field(description="Rented seconds without telemetry or in maintenance.")
    effective_s: int
    effective_gpu_hours: str


class RentalUsageRead(Schema):
    rental_id: uuid.UUID
    gpu_model: str
    gpu_count: int
    running: bool
    buckets_s: dict[str, int]
    billed_s: int
    effective: EffectiveRead
    cost_to_date: str
    cap_allowance: str | None = Field(
        description="The most this rental can cost so far under its cap: the monthly cap per "
        "GPU x (billed GPU-seconds ÷ the period's seconds); credited seconds earn none."
    )
    forecast: str
    forecast_is_cap: bool = Field(
        description="The forecast is the rental's cap allowance extrapolated: the cap binds."
    )


class UsageRead(Schema):
    customer_id: uuid.UUID
    period: str
    period_start: datetime
    period_end: datetime
    as_of: datetime
    currency: str
    buckets_s: dict[str, int]
    effective: EffectiveRead
    cost_to_date: str = Field(description="Rental charges, credits and caps; before vouchers.")
    forecast: str = Field(
        description="Cost to date, plus running rentals to the month's end (or their booked "
        "end) at the current price, plus forecast_new_rentals; before vouchers and tax."
    )
    forecast_new_rentals: str = Field(
        description="The part of the forecast for rentals not made yet: this month's additions "
        "(open-ended rentals started after its first second) kept up at their pace so far."
    )
    forecast_is_cap: bool = Field(description="Some rental's forecast is its cap.")
    vouchers: VoucherLedgerRead
    rentals: list[RentalUsageRead]


class WhatIfCellRead(Schema):
    amount: str
    billed_s: int


class WhatIfRowRead(Schema):
    increment_s: int
    with_credits: WhatIfCellRead
    without_credits: WhatIfCellRead
    difference: str
    credits: str = Field(
        description="The automatic failure and migration credits (negative). The difference "
        "is smaller where a monthly cap also holds the bill without them, larger where a "
        "manual process would bill more downtime than was credited."
    )


class WhatIfRead(Schema):
    customer_id: uuid.UUID
    period: str
    currency: str
    manual_recovery_s: int
    rows: list[WhatIfRowRead]


class CreditNoteRead(Schema):
    id: uuid.UUID
    customer_id: uuid.UUID
    number: str
    invoice_id: uuid.UUID = Field(description="The finalized invoice this credit note corrects.")
    issued_with_invoice_id: uuid.UUID = Field(
        description="The invoice whose late-data adjustments exceeded what it charges."
    )
    currency: str
    amount: str
    tax_rate: str
    tax: str
    total: str
    reason: str
    issued_at: datetime
    stripe_id: str | None
    stripe_status: str | None

    @classmethod
    def of(cls, note: CreditNote) -> CreditNoteRead:
        fields = {name: getattr(note, name) for name in cls.model_fields}
        currency = note.currency
        return cls(
            **{
                **fields,
                "amount": money(note.amount, currency),
                "tax": money(note.tax, currency),
                "total": money(note.total, currency),
                "tax_rate": plain(note.tax_rate),
            }
        )


class MoneyStepRead(Schema):
    key: str = Field(
        description="usage | cap | corrections | vouchers | subtotal | tax | total | prepaid | "
        "amount_due (corrections only when there are some)."
    )
    label: str
    amount: str


class VouchersAppliedRead(Schema):
    usable: str = Field(description="The voucher balance usable now (not expired).")
    applied: str = Field(description="What the vouchers take off this bill (positive).")
    reason: str = Field(description="Why that much applied, or why none did.")


class AmountDueRead(Schema):
    customer_id: uuid.UUID
    period: str
    currency: str
    source: str = Field(
        description='"invoice": the period\'s invoice; "to_date": no invoice yet, the period '
        "to date as an invoice finalized now would show it (vouchers and prepaid balance now)."
    )
    invoice_id: uuid.UUID | None
    invoice_number: str | None
    status: str | None
    as_of: datetime
    steps: list[MoneyStepRead] = Field(description="In order; each a sum of invoice lines.")
    amount_due: str
    vouchers: VouchersAppliedRead
    cap: str | None = Field(description="What the monthly cap took off and why, when it did.")
