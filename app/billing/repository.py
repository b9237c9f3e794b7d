"""Invoice and voucher queries; writes are set-based (one statement per table per invoice)."""

from __future__ import annotations

import json
import uuid
from collections import defaultdict
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import Select, delete, func, select, text, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import Session

from app.auth.service import Principal
from app.auth.tenancy import readable_by
from app.billing.core.lines import LineKind
from app.billing.core.vouchers import EntryKind
from app.billing.models import (
    CreditNote,
    CreditNoteNumberCounter,
    Invoice,
    InvoiceLineRow,
    InvoiceNumberCounter,
    InvoiceStatus,
    UsageRollup,
    UsageRollupSpan,
    VoucherEntryRow,
)
from app.core.db import lock_keys, pipelined
from app.rentals.reads import served

# What a rental cost on its invoice: everything but vouchers, tax and adjustments of others.
_NOT_RENTAL = (LineKind.VOUCHER, LineKind.TAX, LineKind.ADJUSTMENT, LineKind.CREDIT_NOTE)
_RENTAL_KINDS = [k.value for k in LineKind if k not in _NOT_RENTAL]
_LOCKED = (InvoiceStatus.FINALIZED, InvoiceStatus.PAID)


def readable_credit_notes(principal: Principal) -> Select[CreditNote]:
    """Every credit note the principal may read; the API's credit-note lists start here."""
    return select(CreditNote).where(readable_by(principal, CreditNote.customer_id))


def lock_customer_periods(
    session: Session, customer_ids: Collection[uuid.UUID], period: str
) -> None:
    """Serialise runs over each customer and period, so concurrent runs never duplicate; in
    one statement and a fixed order, so two runs over the same customers never deadlock."""
    lock_keys(session, (f"invoice:{customer_id}:{period}" for customer_id in customer_ids))


def live_invoices(
    session: Session, customer_ids: Collection[uuid.UUID], period: str
) -> dict[uuid.UUID, Invoice]:
    """Each customer's non-void invoice for the period, locked for this transaction."""
    rows = session.scalars(
        select(Invoice)
        .where(
            Invoice.customer_id.in_(customer_ids),
            Invoice.period == period,
            Invoice.status != InvoiceStatus.VOID,
        )
        .with_for_update()
    )
    return {invoice.customer_id: invoice for invoice in rows}


# The lines travel as JSON arrays (amounts as exact strings), one statement per chunk: a
# 3,000-GPU rental's month, a stall credit per GPU per failure with its evidence, came to more
# than the 256 MiB one jsonb array may hold.
_LINES_PER_STATEMENT = 5_000
_INSERT_LINES = text("""
INSERT INTO invoice_lines (invoice_id, customer_id, position, kind, amount, rental_id, gpu_model,
    gpu_uuid, start_at, end_at, seconds, rate, voucher_id, evidence, adjusts_invoice_id,
    adjusts_period)
SELECT invoice_id, customer_id, position, kind, amount, rental_id, gpu_model, gpu_uuid,
    start_at, end_at, seconds, rate, voucher_id, evidence, adjusts_invoice_id, adjusts_period
FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS r(invoice_id uuid, customer_id uuid,
    position int, kind text, amount numeric, rental_id uuid, gpu_model text, gpu_uuid text,
    start_at timestamptz, end_at timestamptz, seconds bigint, rate numeric, voucher_id text,
    evidence jsonb, adjusts_invoice_id uuid, adjusts_period text)
""")


def replace_lines(
    session: Session, invoice_id: uuid.UUID, rows: list[dict[str, Any]], is_new: bool = False
) -> None:
    """The invoice's lines become ``rows``; ``is_new``: it has none yet, so none to delete."""
    if not is_new:
        # No session sync: scanning the identity map per delete would make a run quadratic.
        session.execute(
            delete(InvoiceLineRow).where(InvoiceLineRow.invoice_id == invoice_id),
            execution_options={"synchronize_session": False},
        )
    for at in range(0, len(rows), _LINES_PER_STATEMENT):
        chunk = rows[at : at + _LINES_PER_STATEMENT]
        # default=str: Decimal, UUID and datetime become their exact text forms.
        session.execute(_INSERT_LINES, {"rows": json.dumps(chunk, default=str)})


def delete_provisional_entries(session: Session, invoice_id: uuid.UUID) -> None:
    """The applied and expired entries a draft wrote last time it was generated."""
    session.execute(
        delete(VoucherEntryRow).where(
            VoucherEntryRow.invoice_id == invoice_id, VoucherEntryRow.kind != EntryKind.ISSUED
        ),
        execution_options={"synchronize_session": False},
    )


def voucher_entries(
    session: Session, customer_ids: Collection[uuid.UUID]
) -> dict[uuid.UUID, list[VoucherEntryRow]]:
    """Each customer's voucher ledger entries, in every currency, oldest first."""
    query = select(VoucherEntryRow).where(VoucherEntryRow.customer_id.in_(customer_ids))
    entries: dict[uuid.UUID, list[VoucherEntryRow]] = defaultdict(list)
    for entry in session.scalars(query.order_by(VoucherEntryRow.at, VoucherEntryRow.id)):
        entries[entry.customer_id].append(entry)
    return entries


def insert_entries(session: Session, rows: list[dict[str, Any]]) -> None:
    """Append ledger entries; issuing an existing voucher id again changes nothing."""
    if rows:
        statement = pg_insert(VoucherEntryRow).on_conflict_do_nothing(
            index_elements=["voucher_id"], index_where=text("kind = 'issued'")
        )
        session.execute(statement, rows)


def next_number(
    session: Session,
    year: int,
    counter: type[InvoiceNumberCounter | CreditNoteNumberCounter] = InvoiceNumberCounter,
) -> int:
    """The year's next invoice (or credit-note) number. The counter row stays locked (UPDATE
    takes the same row lock as SELECT ... FOR UPDATE) until the finalizing transaction ends,
    so numbers are handed out in commit order and a rolled-back finalization gives its number
    back."""
    session.execute(
        pg_insert(counter)
        .values(year=year, last_number=0)
        .on_conflict_do_nothing(index_elements=["year"])
    )
    number: int = session.execute(
        update(counter)
        .where(counter.year == year)
        .values(last_number=counter.last_number + 1)
        .returning(counter.last_number)
    ).scalar_one()
    return number


def credit_notes_issued_with(session: Session, invoice_id: uuid.UUID) -> Sequence[CreditNote]:
    return session.scalars(
        select(CreditNote).where(CreditNote.issued_with_invoice_id == invoice_id)
    ).all()


def credit_notes_query(
    readable: Select[CreditNote] | None = None,
    *,
    customer_id: uuid.UUID | None = None,
    invoice_id: uuid.UUID | None = None,
) -> Select[CreditNote]:
    """Credit notes, newest first, filtered; ``readable`` as in ``invoices_query``."""
    query = select(CreditNote) if readable is None else readable
    query = query.order_by(CreditNote.issued_at.desc(), CreditNote.number.desc())
    if customer_id is not None:
        query = query.where(CreditNote.customer_id == customer_id)
    if invoice_id is not None:
        query = query.where(CreditNote.invoice_id == invoice_id)
    return query


def earlier_finalized(
    session: Session, customer_ids: Collection[uuid.UUID], before: datetime, after: datetime
) -> dict[uuid.UUID, list[Invoice]]:
    """Finalized or paid invoices whose periods ended in (after, before], oldest first."""
    rows = session.scalars(
        select(Invoice)
        .where(
            Invoice.customer_id.in_(customer_ids),
            Invoice.status.in_(_LOCKED),
            Invoice.period_end <= before,
            Invoice.period_end > after,
        )
        .order_by(Invoice.period_start)
    )
    out: dict[uuid.UUID, list[Invoice]] = defaultdict(list)
    for invoice in rows:
        out[invoice.customer_id].append(invoice)
    return out


def billed_by_rental(session: Session, invoice: Invoice) -> dict[uuid.UUID, Decimal]:
    """What each rental was billed for the invoice's period so far: its own lines there plus
    the adjustments for that invoice already on other finalized or paid invoices."""
    own = select(InvoiceLineRow.rental_id, InvoiceLineRow.amount).where(
        InvoiceLineRow.invoice_id == invoice.id, InvoiceLineRow.kind.in_(_RENTAL_KINDS)
    )
    adjusted = (
        select(InvoiceLineRow.rental_id, InvoiceLineRow.amount)
        .join(Invoice, Invoice.id == InvoiceLineRow.invoice_id)
        .where(InvoiceLineRow.adjusts_invoice_id == invoice.id, Invoice.status.in_(_LOCKED))
    )
    both = own.union_all(adjusted).subquery()
    rows = session.execute(
        select(both.c.rental_id, func.sum(both.c.amount)).group_by(both.c.rental_id)
    )
    return {rental_id: amount for rental_id, amount in rows if rental_id is not None}


def customer_gpus(
    session: Session, customer_id: uuid.UUID, start: datetime, end: datetime
) -> list[str]:
    """GPUs that served any of the customer's rentals during [start, end)."""
    intervals = served(customer_id=customer_id, start=start, end=end).subquery()
    return list(session.scalars(select(intervals.c.gpu_uuid).distinct()))


def void_invoices(session: Session, customer_id: uuid.UUID) -> dict[uuid.UUID, str]:
    """The customer's void invoices: id -> period."""
    rows = session.execute(
        select(Invoice.id, Invoice.period).where(
            Invoice.customer_id == customer_id, Invoice.status == InvoiceStatus.VOID
        )
    )
    return {invoice_id: period for invoice_id, period in rows}


def applied_entries(session: Session, invoice_id: uuid.UUID) -> Sequence[VoucherEntryRow]:
    return session.scalars(
        select(VoucherEntryRow).where(
            VoucherEntryRow.invoice_id == invoice_id, VoucherEntryRow.kind == EntryKind.APPLIED
        )
    ).all()


def issued_entries(session: Session, voucher_ids: Collection[str]) -> dict[str, VoucherEntryRow]:
    rows = session.scalars(
        select(VoucherEntryRow).where(
            VoucherEntryRow.voucher_id.in_(voucher_ids), VoucherEntryRow.kind == EntryKind.ISSUED
        )
    )
    return {row.voucher_id: row for row in rows}


# --- usage rollups (app.billing.rollups) ----------------------------------------------------


def rollup_fingerprints(
    session: Session, customer_id: uuid.UUID, start: int, end: int
) -> dict[int, tuple[int, int]]:
    """Stored spans starting in [start, end): start -> (end, the fingerprint they were rated
    from)."""
    rows = session.execute(
        select(UsageRollupSpan.start, UsageRollupSpan.end, UsageRollupSpan.fingerprint).where(
            UsageRollupSpan.customer_id == customer_id,
            UsageRollupSpan.start >= start,
            UsageRollupSpan.start < end,
        )
    )
    return {lo: (hi, fingerprint) for lo, hi, fingerprint in rows}


def lock_rollups(session: Session, customer_id: uuid.UUID) -> None:
    """Serialise refreshes of one customer's rollups (two first reads of a new day)."""
    session.execute(
        text("SELECT pg_advisory_xact_lock(hashtextextended('usage_rollups:' || :c, 0))"),
        {"c": str(customer_id)},
    )


def replace_rollups(
    session: Session,
    customer_id: uuid.UUID,
    spans: dict[tuple[int, int], int],
    rows: list[dict[str, Any]],
) -> None:
    """Store ``spans`` ([start, end) -> fingerprint) with ``rows``, their parts: the parts
    starting in them are replaced, and so is every stored span overlapping them (a day that
    its hours replace, or hours that their day does), so no span vouches for parts it did
    not write."""
    for start, end in spans:
        session.execute(
            delete(UsageRollup).where(
                UsageRollup.customer_id == customer_id,
                UsageRollup.start >= start,
                UsageRollup.start < end,
            )
        )
        session.execute(
            delete(UsageRollupSpan).where(
                UsageRollupSpan.customer_id == customer_id,
                UsageRollupSpan.start < end,
                UsageRollupSpan.end > start,
            )
        )
    if rows:
        session.execute(pg_insert(UsageRollup), rows)
    session.execute(
        pg_insert(UsageRollupSpan),
        [
            {"customer_id": customer_id, "start": lo, "end": hi, "fingerprint": fingerprint}
            for (lo, hi), fingerprint in spans.items()
        ],
    )


# The stored parts of [lo, hi) summed per (rental, GPU, bucket, price point), except the parts
# in ``b`` buckets or on ``g`` GPUs, which come one by one: the CASE puts each in a group of
# its own (its start), and its seconds and end give that start back.
_ROLLUP_PIECES = text("""
SELECT rental_id, gpu_uuid, bucket, CAST(sum("end" - start) AS bigint), max("end")
FROM usage_rollups
WHERE customer_id = :c AND start >= :lo AND start < :hi
GROUP BY rental_id, gpu_uuid, bucket, price_from,
    CASE WHEN bucket = ANY(CAST(:b AS text[])) OR gpu_uuid = ANY(CAST(:g AS text[])) THEN start END
""")
# The stored parts of the spans ``days`` (bounds) summed per (rental, span index, bucket).
_ROLLUP_SPAN_SECONDS = text("""
SELECT rental_id, width_bucket(start, CAST(:days AS bigint[])) - 1, bucket,
       CAST(sum("end" - start) AS bigint), CAST(sum(idle_s) AS bigint)
FROM usage_rollups
WHERE customer_id = :c AND start >= :lo AND start < :hi
GROUP BY 1, 2, 3
""")


@dataclass(frozen=True)
class StoredRollups:
    pieces: list[Any]  # (rental, GPU, bucket, seconds, last end)
    span_seconds: list[Any]  # (rental, span index, bucket, seconds, idle s)


def stored_rollups(
    session: Session,
    customer_id: uuid.UUID,
    spans: Sequence[int],
    as_stored: Sequence[str],
    gpus_as_stored: Sequence[str],
) -> StoredRollups:
    """The stored parts of ``spans`` (bounds: n spans, n + 1 entries), in one round trip: as
    pieces, summed per (rental, GPU, bucket, price point) except those in ``as_stored``
    buckets or on ``gpus_as_stored``, which come one by one; and summed per (rental, span,
    bucket) with their idle seconds."""
    if len(spans) < 2:
        return StoredRollups([], [])
    where = {"c": customer_id, "lo": spans[0], "hi": spans[-1]}
    pieces, span_seconds = pipelined(
        session,
        [
            (_ROLLUP_PIECES, {**where, "b": list(as_stored), "g": list(gpus_as_stored)}),
            (_ROLLUP_SPAN_SECONDS, {**where, "days": list(spans)}),
        ],
    )
    return StoredRollups(pieces, span_seconds)
