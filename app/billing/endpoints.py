"""Invoices, invoice runs, vouchers, live usage and what-if. Customers see only their own."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Query
from fastapi.responses import HTMLResponse

from app.auth.deps import Admin, ConsoleUser
from app.billing import amount_due, reads, repository, service, usage
from app.billing.html import Seller, invoice_document, render_invoice
from app.billing.loader import PERIOD_PATTERN, current_period, started_period
from app.billing.models import InvoiceStatus
from app.billing.run import as_of_time, run_invoices
from app.billing.schemas import (
    AmountDueRead,
    CreditNoteRead,
    FinalizeBody,
    InvoiceRead,
    InvoiceSummary,
    PaidBody,
    RunCreate,
    RunFailure,
    RunRead,
    UsageRead,
    VoidBody,
    VoucherEntryRead,
    VoucherGrant,
    VoucherLedgerRead,
    WhatIfRead,
)
from app.billing.service import BillingSettings
from app.billing.usage import UsageSettings
from app.core.deps import AppSettings, DbSession
from app.core.pagination import Page, Paging, paginate
from app.customers.models import Customer
from app.customers.service import existing_customer, get_customer

router = APIRouter(prefix="/v1/invoices", tags=["invoices"])
customer_router = APIRouter(prefix="/v1/customers", tags=["invoices"])

PeriodQuery = Annotated[
    str | None,
    Query(pattern=PERIOD_PATTERN, description="YYYY-MM; default: the current month."),
]


def clock() -> datetime:
    """The request's "now"; a dependency so tests can pin it."""
    return datetime.now(UTC)


Now = Annotated[datetime, Depends(clock)]


@router.post("/runs")
def create_run(
    body: RunCreate, session: DbSession, _: Admin, now: Now, settings: AppSettings
) -> RunRead:
    """Draft (and with finalize, finalize) every customer's invoice for the period.
    Idempotent; finalized invoices are never touched."""
    summary = run_invoices(
        session,
        body.period,
        as_of_time(body.as_of, now, ("body", "as_of")),
        config=BillingSettings.of(settings),
        customer_id=body.customer_id,
        finalize=body.finalize,
        force=body.force,
    )
    return RunRead(
        period=summary.period,
        customers=summary.customers,
        counts={o.value: n for o, n in summary.counts.items()},
        failures=[RunFailure(customer_id=c, msg=m) for c, m in summary.failures.items()],
        invoice_ids=summary.invoice_ids,
        seconds=summary.seconds,
    )


@router.get("")
def list_invoices(
    session: DbSession,
    caller: ConsoleUser,
    page: Paging,
    customer_id: uuid.UUID | None = None,
    period: Annotated[str | None, Query(pattern=PERIOD_PATTERN)] = None,
    status: InvoiceStatus | None = None,
) -> Page[InvoiceSummary]:
    """Newest period first; customers see only their own invoices."""
    readable = reads.readable_invoices(caller)
    query = reads.invoices_query(readable, customer_id=customer_id, period=period, status=status)
    return paginate(session, query, page, InvoiceSummary, InvoiceSummary.of)


# `:uuid`: GET /v1/invoices/runs is then a 405 (only POST there), not a 422 for this route.
@router.get("/{invoice_id:uuid}")
def read_invoice(invoice_id: uuid.UUID, session: DbSession, caller: ConsoleUser) -> InvoiceRead:
    return InvoiceRead.of(service.get_invoice(session, invoice_id, caller))


@router.get("/{invoice_id}/html", response_class=HTMLResponse)
def invoice_html(
    invoice_id: uuid.UUID, session: DbSession, caller: ConsoleUser, settings: AppSettings
) -> HTMLResponse:
    """The invoice as a standalone, printable HTML page."""
    invoice = service.get_invoice(session, invoice_id, caller)
    customer = existing_customer(session, invoice.customer_id)
    names = service.rental_names(session, invoice)
    document = invoice_document(InvoiceRead.of(invoice), customer, Seller.of(settings), names)
    return HTMLResponse(render_invoice(document))


@router.get("/{invoice_id}/amount-due")
def invoice_amount_due(
    invoice_id: uuid.UUID, session: DbSession, caller: ConsoleUser, now: Now
) -> AmountDueRead:
    """The invoice's path from usage cost to the amount due (cap, vouchers and why they did or
    did not apply, tax, prepaid balance)."""
    invoice = service.get_invoice(session, invoice_id, caller)
    customer = existing_customer(session, invoice.customer_id)
    return amount_due.of_invoice(session, invoice, customer, now)


@router.get("/{invoice_id}/credit-notes")
def invoice_credit_notes(
    invoice_id: uuid.UUID, session: DbSession, caller: ConsoleUser, page: Paging
) -> Page[CreditNoteRead]:
    """The credit notes that correct this invoice, newest first."""
    invoice = service.get_invoice(session, invoice_id, caller)
    readable = repository.readable_credit_notes(caller)
    query = repository.credit_notes_query(readable, invoice_id=invoice.id)
    return paginate(session, query, page, CreditNoteRead, CreditNoteRead.of)


@router.post("/{invoice_id}/finalize")
def finalize(
    invoice_id: uuid.UUID,
    body: FinalizeBody,
    session: DbSession,
    admin: Admin,
    now: Now,
    settings: AppSettings,
) -> InvoiceRead:
    """Rebuild the draft with current data, number it and lock it."""
    invoice = service.get_invoice(session, invoice_id, admin, lock=True)
    config = BillingSettings.of(settings)
    finalized = service.refresh_and_finalize(session, invoice, now, config, force=body.force)
    return InvoiceRead.of(finalized)


@router.post("/{invoice_id}/void")
def void(
    invoice_id: uuid.UUID, body: VoidBody, session: DbSession, admin: Admin, now: Now
) -> InvoiceRead:
    """Void a finalized invoice; it keeps its number and a new draft may replace it."""
    invoice = service.get_invoice(session, invoice_id, admin, lock=True)
    return InvoiceRead.of(service.void_invoice(session, invoice, now, body.reason))


@router.post("/{invoice_id}/paid")
def mark_paid(
    invoice_id: uuid.UUID, body: PaidBody, session: DbSession, admin: Admin, now: Now
) -> InvoiceRead:
    """Record a payment received outside Stripe (e.g. a bank transfer)."""
    invoice = service.get_invoice(session, invoice_id, admin, lock=True)
    paid_at = body.paid_at or now
    return InvoiceRead.of(service.mark_invoice_paid(session, invoice, paid_at))


def _customer_period(customer: Customer, period: str | None, now: datetime) -> str:
    return period or current_period(customer.billing_timezone, now)


@customer_router.get("/{customer_id}/usage")
def read_usage(
    customer_id: uuid.UUID,
    session: DbSession,
    caller: ConsoleUser,
    now: Now,
    settings: AppSettings,
    period: PeriodQuery = None,
) -> UsageRead:
    """Cost to date with its buckets, effective GPU-hours, vouchers and a month-end forecast."""
    customer = get_customer(session, customer_id, caller)
    name = _customer_period(customer, period, now)
    return usage.usage(session, customer, name, now, UsageSettings.of(settings))


@customer_router.get("/{customer_id}/amount-due")
def read_amount_due(
    customer_id: uuid.UUID,
    session: DbSession,
    caller: ConsoleUser,
    now: Now,
    settings: AppSettings,
    period: PeriodQuery = None,
) -> AmountDueRead:
    """The period's path from usage cost to the amount due: its invoice's, or with no invoice
    yet, the period to date as an invoice finalized now would show it."""
    customer = get_customer(session, customer_id, caller)
    name = _customer_period(customer, period, now)
    billing_period = started_period(name, customer.billing_timezone, now, ("query", "period"))
    return amount_due.of_period(session, customer, billing_period, now, UsageSettings.of(settings))


@customer_router.get("/{customer_id}/credit-notes")
def read_credit_notes(
    customer_id: uuid.UUID, session: DbSession, caller: ConsoleUser, page: Paging
) -> Page[CreditNoteRead]:
    """The customer's credit notes (negative late-data corrections), newest first."""
    customer = get_customer(session, customer_id, caller)
    readable = repository.readable_credit_notes(caller)
    query = repository.credit_notes_query(readable, customer_id=customer.id)
    return paginate(session, query, page, CreditNoteRead, CreditNoteRead.of)


@customer_router.get("/{customer_id}/what-if")
def read_what_if(
    customer_id: uuid.UUID,
    session: DbSession,
    caller: ConsoleUser,
    now: Now,
    settings: AppSettings,
    period: PeriodQuery = None,
) -> WhatIfRead:
    """The period's usage at 1 s, 60 s and 3600 s increments, with and without automatic
    failure and migration credits."""
    customer = get_customer(session, customer_id, caller)
    name = _customer_period(customer, period, now)
    return usage.what_if_table(session, customer, name, now, UsageSettings.of(settings))


@customer_router.get("/{customer_id}/vouchers")
def read_vouchers(
    customer_id: uuid.UUID, session: DbSession, caller: ConsoleUser, now: Now
) -> VoucherLedgerRead:
    customer = get_customer(session, customer_id, caller)
    return usage.voucher_ledger(session, customer, now)


@customer_router.post("/{customer_id}/vouchers", status_code=201)
def grant_voucher(
    customer_id: uuid.UUID, body: VoucherGrant, session: DbSession, admin: Admin, now: Now
) -> VoucherEntryRead:
    """Grant a voucher by hand, with the reason on the ledger."""
    customer = get_customer(session, customer_id, admin)
    entry = service.grant_voucher(
        session, customer, body.amount, body.validity_days, body.reason, now, admin.key_id
    )
    return VoucherEntryRead.of(entry)
