"""Billing's read interface: invoices as the API, the command line and the dashboard list and
show them, and the invoices and credit notes the Stripe mirror (app.payments) finds and locks.

The rest of ``app.billing.repository`` is private to the package.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

from sqlalchemy import Select, func, or_, select, text
from sqlalchemy.orm import Session

from app.auth.service import Principal
from app.auth.tenancy import readable_by
from app.billing.models import CreditNote, Invoice, InvoiceLineRow, InvoiceStatus
from app.core.pagination import where_given


def readable_invoices(principal: Principal) -> Select[Invoice]:
    """Every invoice the principal may read; the API's invoice lists start here."""
    return select(Invoice).where(readable_by(principal, Invoice.customer_id))


def invoices_query(
    readable: Select[Invoice] | None = None,
    *,
    customer_id: uuid.UUID | None = None,
    period: str | None = None,
    status: InvoiceStatus | None = None,
) -> Select[Invoice]:
    """Invoices, newest period first, filtered; ``readable`` (a ``readable_invoices``
    statement) for the API, none for internal reads of a customer already checked."""
    query = select(Invoice) if readable is None else readable
    query = query.order_by(Invoice.period.desc(), Invoice.customer_id, Invoice.id)
    return where_given(
        query,
        (Invoice.customer_id, customer_id),
        (Invoice.period, period),
        (Invoice.status, status),
    )


# --- read by the Stripe mirror (app.payments), which keeps the Stripe ids on the rows ---


def invoice_by_id(session: Session, invoice_id: uuid.UUID) -> Invoice:
    return session.get_one(Invoice, invoice_id)


def invoice_for_stripe(
    session: Session, stripe_invoice_id: str, our_id: str | None
) -> Invoice | None:
    """Our invoice, by the Stripe id we stored or else by the id in the Stripe metadata."""
    conditions = [Invoice.stripe_invoice_id == stripe_invoice_id]
    with contextlib.suppress(ValueError):  # metadata not ours: match by Stripe id alone
        conditions.append(Invoice.id == uuid.UUID(our_id or ""))
    return session.scalars(select(Invoice).where(or_(*conditions)).with_for_update()).first()


def credit_notes_to_mirror(session: Session) -> list[CreditNote]:
    """Credit notes not yet in Stripe (and not failed there) whose corrected invoice is open
    or paid in Stripe, oldest first."""
    query = (
        select(CreditNote)
        .join(Invoice, Invoice.id == CreditNote.invoice_id)
        .where(
            CreditNote.stripe_id.is_(None),
            CreditNote.stripe_error.is_(None),
            Invoice.stripe_invoice_id.is_not(None),
            Invoice.stripe_status.in_(("open", "paid")),
        )
        .order_by(CreditNote.issued_at, CreditNote.number)
    )
    return list(session.scalars(query))


def lock_credit_note(session: Session, credit_note_id: uuid.UUID) -> CreditNote | None:
    """The credit note, locked, if it is still to be mirrored and no other worker holds it."""
    query = (
        select(CreditNote)
        .where(CreditNote.id == credit_note_id, CreditNote.stripe_id.is_(None))
        .with_for_update(skip_locked=True)
    )
    return session.scalars(query).first()


# --- read by the dashboard --------------------------------------------------------------------


_REVENUE = text("""
SELECT i.period, i.currency, i.customer_id, l.kind, sum(l.amount) AS amount,
       count(DISTINCT i.id) AS invoices
FROM invoices i
JOIN invoice_lines l ON l.invoice_id = i.id
WHERE i.status <> 'void' AND i.period >= :first AND i.period <= :last
GROUP BY 1, 2, 3, 4
ORDER BY 1 DESC, 2, 3, 4
""")


def revenue_by_period(session: Session, first: str, last: str) -> list[dict[str, Any]]:
    """Line amounts of the non-void invoices per period, currency, customer and line kind."""
    return [dict(r._mapping) for r in session.execute(_REVENUE, {"first": first, "last": last})]


def live_invoice(session: Session, customer_id: uuid.UUID, period: str) -> Invoice | None:
    """The customer's invoice for the period (draft or finalized), if the run made one."""
    query = invoices_query(customer_id=customer_id, period=period)
    return session.scalar(query.where(Invoice.status != InvoiceStatus.VOID))


def lines_of(session: Session, invoice_id: uuid.UUID, batch: int) -> Iterator[InvoiceLineRow]:
    """The invoice's lines in order, read ``batch`` at a time."""
    query = (
        select(InvoiceLineRow)
        .where(InvoiceLineRow.invoice_id == invoice_id)
        .order_by(InvoiceLineRow.position)
        .execution_options(yield_per=batch)
    )
    return iter(session.scalars(query))


def line_sums(
    session: Session, invoice_id: uuid.UUID
) -> list[tuple[uuid.UUID | None, str, Decimal]]:
    """The invoice's line amounts summed per rental and kind (an export's caps and charges)."""
    query = (
        select(InvoiceLineRow.rental_id, InvoiceLineRow.kind, func.sum(InvoiceLineRow.amount))
        .where(InvoiceLineRow.invoice_id == invoice_id)
        .group_by(InvoiceLineRow.rental_id, InvoiceLineRow.kind)
    )
    return [(rental_id, kind, amount) for rental_id, kind, amount in session.execute(query)]


def line_gpus(session: Session, invoice_id: uuid.UUID) -> list[str]:
    """The GPUs the invoice's lines name (its credit lines')."""
    query = (
        select(InvoiceLineRow.gpu_uuid)
        .where(InvoiceLineRow.invoice_id == invoice_id, InvoiceLineRow.gpu_uuid.is_not(None))
        .distinct()
    )
    return [gpu for gpu in session.scalars(query) if gpu is not None]
