"""Invoices in the database: drafts from the rating core, finalization, void, vouchers.

The rules live in the pure core (``rating``, ``invoice``, ``vouchers``); this module only
loads its inputs, stores its outputs and owns the lifecycle. Services take the session and
never commit: a run or a request is one transaction.

Lifecycle: ``refresh_draft`` (re)builds a customer's draft for a period, replacing its lines,
so generation is idempotent; ``finalize_invoice`` numbers a just-refreshed draft, writes the
voucher ledger entries it implies, issues its tier vouchers and credit notes and sets its due
date; ``void_invoice`` and ``mark_invoice_paid`` are the only later changes (the database
refuses any other).

Choices (documented where the design left room):
* Vouchers are judged at the run's time (``now``, which ``--as-of`` sets): every voucher
  issued by then and not expired applies to an invoice finalized then, whatever period it
  covers, oldest expiry first. A draft shows what would apply at the time it was drafted and
  writes no ledger entries; finalization writes the applications, and for vouchers whose
  expiry has passed by then, expiry entries dated at that expiry.
* Numbers ``GM-<year>-<000001>``: the year is the UTC year of finalization (the date the
  number is issued), gapless per year through a locked counter row. Credit notes:
  ``CN-<year>-<000001>``, a series of their own with its own counter.
* Due date = finalization + the customer's ``days_until_due`` (their payment terms).
* Credit notes: when negative adjustments exceed what the invoice charges, the excess is a
  credit note on each corrected invoice (``invoice.credit_note_lines``), never a negative
  invoice; its tax is the corrected invoice's rate on its amount. An invoice that issued
  credit notes cannot be voided: re-drafting its period would credit the same data twice.
* Late data and corrections: for each earlier finalized or paid invoice whose period ended
  within the ingest retention, if anything it was rated from changed after its finalization
  (minus ``LATE_MARGIN``, covering transactions still in flight then): a segment of the
  customer's GPUs received late, a rental, assignment or migration of the customer created or
  changed, a price effective before the period's end added to a plan it rents on, or a
  maintenance window on its GPUs recorded, overlapping that period, the period is re-rated with
  today's data; each rental's difference to what was billed for it
  (its lines there plus adjustments already finalized elsewhere) becomes an adjustment line.
  Since the difference is taken against what was billed, nothing is ever billed twice.
* Prepaid balance (app.balances): a draft shows the balance it would take, after vouchers and
  tax, as one "prepaid balance applied" line, with the customer's ledger locked until the
  transaction ends; finalization takes exactly that amount, once (keyed by the invoice), and
  voiding gives it back.
* Voiding returns the vouchers the invoice consumed as new vouchers with the same expiry
  (the ledger stays append-only) and takes back what is left of the tier vouchers it earned;
  the replacement earns them again at its finalization, less what was spent of them
  (``vouchers.take_back``, ``vouchers.earned_again``), so a replacement never applies the
  voided invoice's own voucher to itself.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from sqlalchemy.orm import Session

from app.auth.service import Principal
from app.balances import service as balances_service
from app.billing import reads, repository
from app.billing.core.intervals import Span
from app.billing.core.invoice import Invoice as BuiltInvoice
from app.billing.core.invoice import build_invoice
from app.billing.core.lines import InvoiceLine, LineKind
from app.billing.core.rating import RatedRental, rate_rentals
from app.billing.core.vouchers import (
    EntryKind,
    VoucherEntry,
    earned_again,
    issue_tier_vouchers,
    issue_voucher,
    open_vouchers,
    take_back,
)
from app.billing.loader import BillingPeriod, PeriodInputs, load_inputs
from app.billing.models import (
    CreditNote,
    CreditNoteNumberCounter,
    Invoice,
    InvoiceStatus,
    VoucherEntryRow,
)
from app.billing.schemas import money
from app.core.epoch import epoch, from_epoch
from app.core.errors import Conflict, Unprocessable, not_found
from app.core.money import MONEY_LIMIT, display, minor_units, round_money
from app.customers.models import Customer
from app.customers.service import existing_customer
from app.events.service import publish
from app.fleet import service as fleet_service
from app.metering.reads import late_segments_since
from app.plans import service as plans_service
from app.rentals import service as rentals_service
from app.rentals.service import display_names
from app.settings import Settings

LATE_MARGIN = timedelta(hours=1)


@dataclass(frozen=True)
class Draft:
    """The period's invoice and, when it was (re)built as a draft now, the rated rentals and
    the core's invoice it was built from (finalization needs both); an invoice past draft is
    left untouched."""

    invoice: Invoice
    rated: list[RatedRental]
    built: BuiltInvoice | None = None


def get_invoice(
    session: Session, invoice_id: uuid.UUID, principal: Principal, *, lock: bool = False
) -> Invoice:
    """The invoice, if the caller may see it; 404 otherwise, so existence never leaks."""
    statement = reads.readable_invoices(principal).where(Invoice.id == invoice_id)
    invoice = session.scalars(statement.with_for_update() if lock else statement).one_or_none()
    if invoice is None:
        raise not_found("invoice", invoice_id)
    return invoice


def rental_names(session: Session, invoice: Invoice) -> dict[uuid.UUID, str]:
    """What the invoice's lines call its rentals: their display names in its time zone."""
    ids = {line.rental_id for line in invoice.lines if line.rental_id is not None}
    return display_names(session, invoice.customer_id, ids, invoice.timezone)


def rate(
    inputs: PeriodInputs, customer_id: uuid.UUID, cap_period: Span | None = None
) -> list[RatedRental]:
    """The customer's rentals rated over ``inputs.span``; ``cap_period`` is the whole billing
    period when the span is cut short (usage to date), so caps prorate over the month."""
    return rate_rentals(inputs.for_customer(customer_id), cap_period)


@dataclass(frozen=True)
class BillingSettings:
    """The settings the invoice lifecycle follows, handed in by its callers."""

    grace_hours: int  # a period may be finalized this long after it ends (late telemetry)
    retention_days: int  # older telemetry is refused, so older periods cannot change
    balance_low_threshold: Decimal  # a prepaid balance taken below it is low (balances)

    @classmethod
    def of(cls, settings: Settings) -> BillingSettings:
        return cls(
            settings.invoice_grace_hours,
            settings.ingest_retention_days,
            settings.balance_low_threshold,
        )


@dataclass(frozen=True)
class DraftBatch:
    """What refreshing drafts of one period reads, read for many customers at once (an
    invoice run reads one batch per billing time zone instead of ~7 statements a customer):
    their invoice-period locks taken, their live invoices locked, the inputs, the earlier
    finalized invoices to correct with their periods' inputs, the voucher ledgers and the
    prepaid balances (ledgers locked). Rating and building the drafts read nothing more."""

    inputs: PeriodInputs
    invoices: dict[uuid.UUID, Invoice]
    corrections: dict[uuid.UUID, list[Correction]]
    vouchers: dict[uuid.UUID, list[VoucherEntryRow]]
    balances: dict[uuid.UUID, Decimal]


@dataclass(frozen=True)
class Correction:
    """An earlier finalized invoice whose period's facts changed after it was finalized: that
    period's inputs as they are now, and what each rental was billed for it so far."""

    invoice: Invoice
    inputs: PeriodInputs
    billed: dict[uuid.UUID, Decimal]


def draft_batch(
    session: Session,
    customers: Sequence[Customer],
    period: BillingPeriod,
    now: datetime,
    config: BillingSettings,
) -> DraftBatch:
    ids = [c.id for c in customers]
    repository.lock_customer_periods(session, ids, period.name)  # before reading any of it
    invoices = repository.live_invoices(session, ids, period.name)
    drafted = [i for i in ids if i not in invoices or invoices[i].status == InvoiceStatus.DRAFT]
    return DraftBatch(
        inputs=load_inputs(session, ids, period.span),
        invoices=invoices,
        corrections=_corrections(session, drafted, period, lookback(now, config)),
        vouchers=repository.voucher_entries(session, ids),
        balances=balances_service.available(session, customers),
    )


def refresh_draft(
    session: Session,
    customer: Customer,
    period: BillingPeriod,
    now: datetime,
    batch: DraftBatch,
) -> Draft | None:
    """Build or rebuild the customer's draft for ``period`` with current data.

    A finalized or paid invoice of the period comes back untouched; None means there is
    nothing to bill (no rentals, no adjustments, no draft). ``batch`` (``draft_batch``, with
    this customer among its customers) is what was read for it, with other customers of a run.
    """
    invoice = batch.invoices.get(customer.id)
    if invoice is not None and invoice.status != InvoiceStatus.DRAFT:
        return Draft(invoice, [])
    corrections = batch.corrections.get(customer.id, [])
    with core_errors(customer):
        rated = rate(batch.inputs, customer.id)
        adjustments = [line for c in corrections for line in _adjustments(customer.id, c)]
    if invoice is None and not rated and not adjustments:
        return None
    is_new = invoice is None
    invoice = invoice or _new_invoice(customer, period)
    vouchers = [e for e in batch.vouchers.get(customer.id, []) if e.currency == invoice.currency]
    built = _build(
        customer, invoice, rated, adjustments, vouchers, batch.balances[customer.id], now
    )
    _write_draft(session, invoice, built, customer.tax_rate or Decimal(0), now, is_new)
    return Draft(invoice, rated, built)


def finalize_invoice(
    session: Session, draft: Draft, now: datetime, config: BillingSettings, *, force: bool = False
) -> Invoice:
    """Number a draft refreshed in this transaction at ``now``, write the voucher entries it
    implies, issue its tier vouchers and credit notes, and lock it. Refused before the
    period's grace time has passed unless ``force``."""
    invoice, built = draft.invoice, draft.built
    if invoice.status != InvoiceStatus.DRAFT or built is None:
        raise Conflict(f"invoice {invoice.number} is already {invoice.status.value}", ("path",))
    check_grace(invoice.period, invoice.period_end, now, force, config)
    customer = existing_customer(session, invoice.customer_id)
    invoice.number = f"GM-{now.year:04d}-{repository.next_number(session, now.year):06d}"
    invoice.status = InvoiceStatus.FINALIZED
    invoice.finalized_at = now
    invoice.due_at = now + timedelta(days=customer.days_until_due)
    session.flush()
    span = (epoch(invoice.period_start), epoch(invoice.period_end))
    tier = _earned(session, invoice, issue_tier_vouchers(draft.rated, span, epoch(now)))
    entries = [*built.voucher_applications, *built.voucher_expirations, *tier]
    repository.insert_entries(session, [_entry_row(e, invoice) for e in entries])
    if prepaid := _sum_of(built, LineKind.PREPAID_BALANCE):
        balances_service.apply_to_invoice(
            session, customer, invoice.id, invoice.number, -prepaid, config.balance_low_threshold
        )
    _publish(session, "invoice.finalized", invoice)
    for voucher in tier:
        _publish_voucher(session, voucher, invoice.currency)
    _issue_credit_notes(session, invoice, built, now)
    return invoice


def _earned(session: Session, invoice: Invoice, tier: list[VoucherEntry]) -> list[VoucherEntry]:
    """The tier vouchers the invoice earns: when it replaces a voided invoice of its period,
    those again, less what was spent of the voided one's (``vouchers.earned_again``)."""
    void_ids = repository.void_invoices(session, invoice.customer_id) if tier else {}
    if not any(period == invoice.period for period in void_ids.values()):
        return tier
    entries = ledger(
        repository.voucher_entries(session, [invoice.customer_id])[invoice.customer_id]
    )
    voided = [
        e
        for e in entries
        if e.kind is EntryKind.ISSUED
        and e.source == "tier"
        and e.invoice_id is not None
        and void_ids.get(uuid.UUID(e.invoice_id)) == invoice.period
    ]
    return earned_again(tier, voided, entries, {str(i) for i in void_ids}, str(invoice.id))


def _issue_credit_notes(
    session: Session, invoice: Invoice, built: BuiltInvoice, now: datetime
) -> None:
    for line in built.lines:
        if line.kind is not LineKind.CREDIT_NOTE:
            continue
        assert line.adjusts_invoice_id is not None  # credit_note_lines always sets it
        corrected = session.get_one(Invoice, uuid.UUID(line.adjusts_invoice_id))
        tax = round_money(line.amount * corrected.tax_rate, invoice.currency)
        number = repository.next_number(session, now.year, CreditNoteNumberCounter)
        note = CreditNote(
            id=uuid.uuid4(),
            customer_id=invoice.customer_id,
            number=f"CN-{now.year:04d}-{number:06d}",
            invoice_id=corrected.id,
            issued_with_invoice_id=invoice.id,
            currency=invoice.currency,
            amount=line.amount,
            tax_rate=corrected.tax_rate,
            tax=tax,
            total=line.amount + tax,
            reason=f"late-data corrections to {corrected.number} ({corrected.period}) "
            f"beyond what invoice {invoice.number} charges",
            issued_at=now,
        )
        session.add(note)
        session.flush()
        data = {
            "credit_note_id": note.id,
            "number": note.number,
            "invoice_id": corrected.id,
            "invoice_number": corrected.number,
            "issued_with_invoice_id": invoice.id,
            "currency": note.currency,
            "amount": money(note.amount, note.currency),
            "tax": money(note.tax, note.currency),
            "total": money(note.total, note.currency),
            "issued_at": now.isoformat(),
        }
        subject = f"credit_note/{note.id}"
        publish(session, "credit_note.issued", data, subject=subject, customer_id=note.customer_id)


def _publish_voucher(session: Session, voucher: VoucherEntry, currency: str) -> None:
    """``voucher.issued`` for a tier or manual voucher (issuing is idempotent by id, so a
    re-finalization can publish a voucher id again; its ``voucher_id`` identifies it)."""
    assert voucher.expires_at is not None  # issued entries carry their expiry
    data = {
        "voucher_id": voucher.voucher_id,
        "source": voucher.source,
        "amount": money(voucher.amount, currency),
        "currency": currency,
        "issued_at": from_epoch(voucher.at).isoformat(),
        "expires_at": from_epoch(voucher.expires_at).isoformat(),
        "reason": voucher.reason,
    }
    customer_id = uuid.UUID(voucher.customer_id)
    publish(
        session,
        "voucher.issued",
        data,
        subject=f"voucher/{voucher.voucher_id}",
        customer_id=customer_id,
    )


def refresh_and_finalize(
    session: Session,
    invoice: Invoice,
    now: datetime,
    config: BillingSettings,
    *,
    force: bool = False,
) -> Invoice:
    """The single-invoice path (API): rebuild the draft with current data, then finalize."""
    if invoice.status != InvoiceStatus.DRAFT:
        raise Conflict(f"invoice {invoice.number} is already {invoice.status.value}", ("path",))
    customer = existing_customer(session, invoice.customer_id)
    period = BillingPeriod(
        invoice.period, invoice.timezone, (epoch(invoice.period_start), epoch(invoice.period_end))
    )
    batch = draft_batch(session, [customer], period, now, config)
    draft = refresh_draft(session, customer, period, now, batch)
    assert draft is not None  # the draft row exists, so there is something to refresh
    return finalize_invoice(session, draft, now, config, force=force)


def void_invoice(session: Session, invoice: Invoice, now: datetime, reason: str) -> Invoice:
    """Void a finalized invoice: it keeps its number; the vouchers it consumed come back."""
    if invoice.status != InvoiceStatus.FINALIZED:
        raise Conflict(
            f"only a finalized invoice can be voided; this one is {invoice.status.value}",
            ("path",),
        )
    if notes := repository.credit_notes_issued_with(session, invoice.id):
        numbers = ", ".join(n.number for n in notes)
        raise Conflict(
            f"invoice {invoice.number} issued credit note(s) {numbers}: voiding it would credit "
            "the same corrections twice; correct it with a manual voucher instead",
            ("path",),
        )
    invoice.status = InvoiceStatus.VOID
    invoice.voided_at = now
    invoice.void_reason = reason
    session.flush()
    applied = repository.applied_entries(session, invoice.id)
    originals = repository.issued_entries(session, {e.voucher_id for e in applied})
    returned = [
        {
            "customer_id": e.customer_id,
            "voucher_id": f"reissue:{invoice.id}:{e.voucher_id}",
            "kind": EntryKind.ISSUED.value,
            "amount": e.amount,
            "currency": e.currency,
            "at": now,
            "expires_at": originals[e.voucher_id].expires_at,
            "source": "reissue",
            "reason": f"returned from voided invoice {invoice.number}",
            "invoice_id": invoice.id,
        }
        for e in applied
    ]
    repository.insert_entries(session, returned)
    _take_back_earned(session, invoice, now)
    customer = existing_customer(session, invoice.customer_id)
    assert invoice.number is not None  # a finalized invoice is numbered
    balances_service.return_from_invoice(session, customer, invoice.id, invoice.number)
    _publish(session, "invoice.voided", invoice, reason=reason)
    return invoice


def _take_back_earned(session: Session, invoice: Invoice, now: datetime) -> None:
    """What is left of the vouchers a voided invoice earned (and of their reissues) is taken
    back: its replacement earns them again at finalization (``vouchers.take_back``)."""
    rows = repository.voucher_entries(session, [invoice.customer_id])[invoice.customer_id]
    entries = ledger(rows)
    earned = [
        e
        for e in entries
        if e.kind is EntryKind.ISSUED and e.source == "tier" and e.invoice_id == str(invoice.id)
    ]
    reason = f"earned by voided invoice {invoice.number}: its replacement earns it again"
    revoked = take_back(earned, entries, epoch(now), str(invoice.id), reason)
    repository.insert_entries(session, [_entry_row(e, invoice) for e in revoked])


def mark_invoice_paid(session: Session, invoice: Invoice, paid_at: datetime) -> Invoice:
    if invoice.status != InvoiceStatus.FINALIZED:
        raise Conflict(
            f"only a finalized invoice can be paid; this one is {invoice.status.value}", ("path",)
        )
    invoice.status = InvoiceStatus.PAID
    invoice.paid_at = paid_at
    session.flush()
    _publish(session, "invoice.paid", invoice)
    return invoice


def grant_voucher(
    session: Session,
    customer: Customer,
    amount: Decimal,
    validity_days: int,
    reason: str,
    now: datetime,
    admin_key_id: uuid.UUID,
) -> VoucherEntryRow:
    """An admin's manual voucher, in the customer's currency."""
    if round_money(amount, customer.currency) != amount:
        raise Unprocessable(
            f"a {customer.currency} amount has at most {minor_units(customer.currency)} decimals",
            ("body", "amount"),
        )
    entry = issue_voucher(
        f"manual:{uuid.uuid4()}",
        str(customer.id),
        amount,
        epoch(now),
        validity_days,
        "manual",
        reason,
    )
    row = VoucherEntryRow(**_entry_fields(entry, customer.currency), created_by=admin_key_id)
    session.add(row)
    session.flush()
    _publish_voucher(session, entry, customer.currency)
    return row


def check_grace(
    period: str, period_end: datetime, now: datetime, force: bool, config: BillingSettings
) -> None:
    grace_end = period_end + timedelta(hours=config.grace_hours)
    if now < grace_end and not force:
        raise Conflict(
            f"period {period} may be finalized from {grace_end.isoformat()} (period end plus "
            "the grace time for late telemetry); pass force to finalize earlier",
            ("body", "force"),
        )


def ledger(entries: Iterable[VoucherEntryRow]) -> list[VoucherEntry]:
    return [
        VoucherEntry(
            EntryKind(e.kind),
            e.voucher_id,
            str(e.customer_id),
            e.amount,
            epoch(e.at),
            None if e.expires_at is None else epoch(e.expires_at),
            e.source,
            e.reason,
            None if e.invoice_id is None else str(e.invoice_id),
        )
        for e in entries
    ]


def _publish(session: Session, event_type: str, invoice: Invoice, **extra: str) -> None:
    """The invoice's lifecycle event (payments mirrors it to Stripe; webhooks deliver it)."""
    stamps = {
        "finalized_at": invoice.finalized_at,
        "voided_at": invoice.voided_at,
        "paid_at": invoice.paid_at,
    }
    data = {
        "invoice_id": invoice.id,
        "number": invoice.number,
        "period": invoice.period,
        "status": invoice.status.value,
        "currency": invoice.currency,
        "subtotal": money(invoice.subtotal, invoice.currency),
        "tax": money(invoice.tax, invoice.currency),
        "total": money(invoice.subtotal + invoice.tax, invoice.currency),
        "amount_due": money(invoice.total, invoice.currency),
        **{name: at.isoformat() for name, at in stamps.items() if at is not None},
        **extra,
    }
    publish(
        session, event_type, data, subject=f"invoice/{invoice.id}", customer_id=invoice.customer_id
    )


# --- drafts -------------------------------------------------------------------------------


@contextmanager
def core_errors(customer: Customer) -> Iterator[None]:
    """The core's ValueErrors are bad configuration (no price in effect, a plan in another
    currency than the customer's): a 422 naming the customer, not a crash."""
    try:
        yield
    except ValueError as error:
        raise Unprocessable(f"customer {customer.id}: {error}", ("customer_id",)) from None


def lookback(now: datetime, config: BillingSettings) -> datetime:
    """Telemetry older than the ingest retention is refused, so older periods cannot change."""
    return now - timedelta(days=config.retention_days)


def _new_invoice(customer: Customer, period: BillingPeriod) -> Invoice:
    return Invoice(
        id=uuid.uuid4(),
        customer_id=customer.id,
        period=period.name,
        period_start=period.start,
        period_end=period.end,
        timezone=period.timezone,
        currency=customer.currency,
        status=InvoiceStatus.DRAFT,
    )


def _build(
    customer: Customer,
    invoice: Invoice,
    rated: Sequence[RatedRental],
    adjustments: Sequence[InvoiceLine],
    vouchers: Sequence[VoucherEntryRow],
    balance: Decimal,
    now: datetime,
) -> BuiltInvoice:
    """The core's invoice, computed before anything is written, so a customer the core rejects
    leaves nothing behind. Vouchers (the customer's entries in the invoice's currency): those
    issued by ``now`` (entries of drafts written by earlier versions, provisional, are ignored
    and deleted by ``_write_draft``)."""
    as_of = epoch(now)
    usable = [
        e
        for e in vouchers
        if (e.invoice_id != invoice.id or e.kind == EntryKind.ISSUED) and epoch(e.at) <= as_of
    ]
    with core_errors(customer):
        built = build_invoice(
            str(invoice.id),
            str(customer.id),
            invoice.currency,
            rated,
            open_vouchers(ledger(usable)),
            as_of,
            customer.tax_rate or Decimal(0),
            adjustments,
            balance,
        )
        _check_storable(built)
    return built


def _check_storable(built: BuiltInvoice) -> None:
    """Every amount of the invoice (each line, so each sum of them) fits its columns. Prices
    are bounded where they enter so one rental always fits, but a customer may hold many."""
    if (gross := sum((abs(line.amount) for line in built.lines), Decimal(0))) >= MONEY_LIMIT:
        raise ValueError(
            f"the invoice's amounts ({display(gross, built.currency)} in all) exceed what an "
            f"invoice holds (below {MONEY_LIMIT:,f}): check the prices and GPU counts of its "
            "rentals"
        )


def _write_draft(
    session: Session,
    invoice: Invoice,
    built: BuiltInvoice,
    tax_rate: Decimal,
    now: datetime,
    is_new: bool,
) -> None:
    """The draft's totals and lines; a new one has no lines or provisional entries to delete."""
    tax, prepaid = _sum_of(built, LineKind.TAX), _sum_of(built, LineKind.PREPAID_BALANCE)
    invoice.total, invoice.tax, invoice.subtotal = built.total, tax, built.total - tax - prepaid
    invoice.tax_rate, invoice.generated_at = tax_rate, now
    session.add(invoice)
    session.flush()
    if not is_new:
        repository.delete_provisional_entries(session, invoice.id)
    rows = [_line_row(invoice, i, line) for i, line in enumerate(built.lines)]
    repository.replace_lines(session, invoice.id, rows, is_new)
    session.expire(invoice, ["lines"])


def _sum_of(built: BuiltInvoice, kind: LineKind) -> Decimal:
    return sum((line.amount for line in built.lines if line.kind is kind), Decimal(0))


def _corrections(
    session: Session, customer_ids: list[uuid.UUID], period: BillingPeriod, after: datetime
) -> dict[uuid.UUID, list[Correction]]:
    """The customers' invoices finalized for periods that ended after ``after`` (oldest first)
    whose facts changed since, each with its period re-read: one load per earlier period, for
    all its changed invoices."""
    earlier = repository.earlier_finalized(session, customer_ids, period.start, after)
    changed: dict[Span, list[Invoice]] = {}
    for invoice in (i for invoices in earlier.values() for i in invoices):
        if _changed_since_finalized(session, invoice):
            span = (epoch(invoice.period_start), epoch(invoice.period_end))
            changed.setdefault(span, []).append(invoice)
    loaded: dict[uuid.UUID, Correction] = {}
    for span, invoices in changed.items():
        inputs = load_inputs(session, [i.customer_id for i in invoices], span)
        for invoice in invoices:
            billed = repository.billed_by_rental(session, invoice)
            loaded[invoice.id] = Correction(invoice, inputs, billed)
    return {
        customer_id: [loaded[i.id] for i in invoices if i.id in loaded]
        for customer_id, invoices in earlier.items()
    }


def _changed_since_finalized(session: Session, earlier: Invoice) -> bool:
    """Whether anything the period was rated from changed after its finalization (less
    ``LATE_MARGIN``): telemetry, a rental, assignment or migration, a price effective in it,
    a maintenance window recorded late. Each owner package answers for its own rows."""
    assert earlier.finalized_at is not None
    start, end = earlier.period_start, earlier.period_end
    since = earlier.finalized_at - LATE_MARGIN
    customer_id = earlier.customer_id
    gpus = repository.customer_gpus(session, customer_id, start, end)
    return (
        (bool(gpus) and late_segments_since(session, gpus, epoch(start), epoch(end), since))
        or rentals_service.changed_since(session, customer_id, start, end, since)
        or plans_service.prices_added_since(session, customer_id, end, since)
        or (
            bool(gpus)
            and fleet_service.maintenance_recorded_since(session, gpus, start, end, since)
        )
    )


def _adjustments(customer_id: uuid.UUID, correction: Correction) -> list[InvoiceLine]:
    """Adjustment lines for corrections to one earlier finalized invoice's period."""
    earlier, span = correction.invoice, correction.inputs.span
    lines = []
    for rated in rate(correction.inputs, customer_id):
        rental_id = uuid.UUID(rated.rental.rental_id)
        invoiced = correction.billed.get(rental_id, Decimal(0))
        if rated.net == invoiced:
            continue
        lines.append(
            InvoiceLine(
                LineKind.ADJUSTMENT,
                rated.net - invoiced,
                earlier.currency,
                rental_id=rated.rental.rental_id,
                gpu_model=rated.rental.gpu_model,
                start=span[0],
                end=span[1],
                adjusts_invoice_id=str(earlier.id),
                adjusts_period=earlier.period,
                evidence={
                    "invoice_number": earlier.number,
                    "billed": str(round_money(invoiced, earlier.currency)),
                    "rerated": str(rated.net),
                    "buckets_s": {str(b): s for b, s in rated.buckets.items() if s},
                },
            )
        )
    return lines


def _line_row(invoice: Invoice, position: int, line: InvoiceLine) -> dict[str, Any]:
    return {
        "invoice_id": invoice.id,
        "customer_id": invoice.customer_id,
        "position": position,
        "kind": line.kind.value,
        "amount": line.amount,
        "rental_id": None if line.rental_id is None else uuid.UUID(line.rental_id),
        "gpu_model": line.gpu_model,
        "gpu_uuid": line.gpu_uuid,
        "start_at": None if line.start is None else from_epoch(line.start),
        "end_at": None if line.end is None else from_epoch(line.end),
        "seconds": line.seconds,
        "rate": line.rate,
        "voucher_id": line.voucher_id,
        "evidence": None if line.evidence is None else dict(line.evidence),
        "adjusts_invoice_id": None
        if line.adjusts_invoice_id is None
        else uuid.UUID(line.adjusts_invoice_id),
        "adjusts_period": line.adjusts_period,
    }


def _entry_fields(entry: VoucherEntry, currency: str) -> dict[str, Any]:
    return {
        "customer_id": uuid.UUID(entry.customer_id),
        "voucher_id": entry.voucher_id,
        "kind": entry.kind.value,
        "amount": entry.amount,
        "currency": currency,
        "at": from_epoch(entry.at),
        "expires_at": None if entry.expires_at is None else from_epoch(entry.expires_at),
        "source": entry.source,
        "reason": entry.reason,
    }


def _entry_row(entry: VoucherEntry, invoice: Invoice) -> dict[str, Any]:
    return {**_entry_fields(entry, invoice.currency), "invoice_id": invoice.id}
