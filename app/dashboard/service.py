"""View models of the dashboard pages, built from the other domains' services.

Every number on a page comes from the same service function (and read model) as the JSON API
the console calls, so the page and the API always agree; this module only picks, formats and
arranges.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any
from urllib.parse import urlencode

from markupsafe import Markup
from sqlalchemy.orm import Session

from app.auth.service import Principal
from app.balances import service as balances
from app.balances.schemas import BalanceRead
from app.billing import amount_due
from app.billing import reads as billing_reads
from app.billing import schemas as billing_schemas
from app.billing import service as billing
from app.billing import usage as billing_usage
from app.billing.core.rating import RatedRental
from app.billing.html import InvoiceDocument, Seller, invoice_document, render_document
from app.billing.loader import BillingPeriod, current_period, started_period
from app.billing.usage import UsageSettings
from app.budgets import service as budgets
from app.budgets.models import Budget
from app.budgets.schemas import BudgetStatus
from app.core.epoch import epoch
from app.core.errors import NotFound, Unprocessable, not_found
from app.customers.models import Customer
from app.customers.reads import customers_query
from app.customers.service import customer_by_id, get_customer
from app.dashboard import bands, incidents, rental_labels
from app.dashboard.formatting import Formatter
from app.rentals.models import Rental
from app.rentals.service import get_rental

LATEST_EVENTS = 10


@dataclass(frozen=True)
class Viewer:
    """Who looks at which customer: a customer at itself, or an admin at any customer."""

    principal: Principal
    customer: Customer
    fmt: Formatter

    @property
    def as_admin(self) -> bool:
        return self.principal.is_admin

    def url(self, path: str, **params: str | None) -> str:
        """A dashboard link that keeps an admin on the customer it is looking at."""
        query = {k: v for k, v in params.items() if v is not None}
        if self.as_admin:
            query = {"customer": str(self.customer.id), **query}
        return f"{path}?{urlencode(query)}" if query else path


def viewer(session: Session, principal: Principal, customer_id: uuid.UUID | None) -> Viewer:
    """A customer sees itself (naming another customer is a 404); an admin names one."""
    if customer_id is None:
        if principal.customer_id is None:
            raise NotFound("choose a customer: ?customer=<id>", ("query", "customer"))
        customer_id = principal.customer_id
    customer = get_customer(session, customer_id, principal)
    return Viewer(principal, customer, Formatter(customer.currency, customer.billing_timezone))


def current_period_of(customer: Customer, now: datetime) -> str:
    return current_period(customer.billing_timezone, now)


def period_of(customer: Customer, name: str | None, now: datetime) -> BillingPeriod:
    """The named month (default: the current one) in the customer's time zone; not a future
    one, which has nothing to show yet."""
    name = name or current_period_of(customer, now)
    try:
        return started_period(name, customer.billing_timezone, now, ("query", "period"))
    except ValueError as error:  # not YYYY-MM
        raise Unprocessable(str(error), ("query", "period")) from None


def is_closed(period: BillingPeriod, now: datetime) -> bool:
    """The month is over: its figures are final (before late data), not "to date"."""
    return epoch(now) >= period.span[1]


# --- overview ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Overview:
    usage: billing_schemas.UsageRead
    events: list[dict[str, Any]]
    incidents: list[incidents.IncidentRead]
    budgets: list[BudgetStatus]
    balance: BalanceRead  # the prepaid balance (app.balances), as GET .../balance has it
    due: billing_schemas.AmountDueRead  # as GET .../amount-due has it
    rentals: dict[uuid.UUID, str]  # what to call each rental shown (rental_labels)

    @property
    def idle_share(self) -> Decimal | None:
        rented = self.usage.effective.rented_s
        return None if not rented else Decimal(self.usage.effective.idle_s) / rented

    @property
    def next_expiry(self) -> billing_schemas.OpenVoucherRead | None:
        return min(self.usage.vouchers.open, key=lambda v: v.expires_at, default=None)


def overview(
    session: Session,
    v: Viewer,
    period: BillingPeriod,
    now: datetime,
    low_balance: Decimal,
    config: UsageSettings,
) -> Overview:
    """The overview page; ``low_balance`` is the ``balance_low_threshold`` setting."""
    usage, rated = billing_usage.usage_and_rated(session, v.customer, period.name, now, config)
    hi = min(period.span[1], epoch(now))
    events = incidents.latest_events(session, v.customer.id, period.span[0], hi, LATEST_EVENTS)
    found = incidents.incidents(session, v.customer, period, now, v.fmt, config)
    spend = budgets.status(budgets.budgets_of(session, v.customer), usage)
    currency = v.customer.currency
    prepaid = BalanceRead.of(
        v.customer.id,
        currency,
        balances.balance(session, v.customer),
        balances.low_threshold(low_balance, currency),
    )
    due = amount_due.of_period(session, v.customer, period, now, config, rated)
    shown = {r.rental_id for r in usage.rentals} | {e["rental_id"] for e in events}
    shown |= {s.budget.rental_id for s in spend if s.budget.rental_id is not None}
    labels = rental_labels.labels(session, v.customer.id, shown, v.fmt)
    return Overview(usage, events, found, spend, prepaid, due, labels)


# --- rental -------------------------------------------------------------------------------


@dataclass(frozen=True)
class RentalPage:
    rental: Rental
    label: str  # its name, else what it rents and when
    chart: bands.BandChart | None  # None: nothing of the rental falls in the period yet
    window: tuple[int, int]
    incidents: list[incidents.IncidentRead]


def rental_page(
    session: Session,
    v: Viewer,
    rental_id: uuid.UUID,
    period: BillingPeriod,
    now: datetime,
    config: UsageSettings,
    gpu_page: int = 1,
) -> RentalPage:
    rental = get_rental(session, rental_id, v.principal)
    if rental.customer_id != v.customer.id:  # an admin's link naming two customers
        raise not_found("rental", rental_id)
    window = _rented_window(rental, period, now)
    label = rental_labels.label(rental, v.fmt)
    mine = [
        i
        for i in incidents.incidents(session, v.customer, period, now, v.fmt, config)
        if i.rental_id == rental.id
    ]
    if window[0] >= window[1]:
        return RentalPage(rental, label, None, window, mine)
    chart = bands.build(session, rental, v.principal, v.fmt, window, gpu_page)
    return RentalPage(rental, label, chart, window, mine)


def _rented_window(rental: Rental, period: BillingPeriod, now: datetime) -> tuple[int, int]:
    end = rental.end_at or datetime.max.replace(tzinfo=UTC)
    lo = max(period.span[0], epoch(rental.start_at))
    hi = min(period.span[1], epoch(min(end, now)))
    return lo, hi


# --- invoices and what-if -----------------------------------------------------------------


def invoices(session: Session, v: Viewer) -> list[billing_schemas.InvoiceSummary]:
    query = billing_reads.invoices_query(customer_id=v.customer.id)
    return [billing_schemas.InvoiceSummary.of(i) for i in session.scalars(query)]


@dataclass(frozen=True)
class InvoiceView:
    invoice: billing_schemas.InvoiceRead
    document: InvoiceDocument  # the same document as GET /v1/invoices/{id}/html and the PDF
    due: billing_schemas.AmountDueRead  # as GET /v1/invoices/{id}/amount-due has it

    @property
    def html(self) -> Markup:
        return Markup(render_document(self.document))  # every value escaped by the renderer


def invoice(
    session: Session, v: Viewer, invoice_id: uuid.UUID, now: datetime, seller: Seller
) -> InvoiceView:
    found = billing.get_invoice(session, invoice_id, v.principal)
    if found.customer_id != v.customer.id:
        raise not_found("invoice", invoice_id)
    read = billing_schemas.InvoiceRead.of(found)
    due = amount_due.of_invoice(session, found, v.customer, now)
    names = billing.rental_names(session, found)
    return InvoiceView(read, invoice_document(read, v.customer, seller, names), due)


def period_amount_due(
    session: Session,
    v: Viewer,
    period: BillingPeriod,
    now: datetime,
    config: UsageSettings,
    rated: Sequence[RatedRental] | None = None,
) -> billing_schemas.AmountDueRead:
    """``rated``: the period's rentals rated to date, when the page has them already."""
    return amount_due.of_period(session, v.customer, period, now, config, rated)


def what_if(
    session: Session, v: Viewer, period: BillingPeriod, now: datetime, config: UsageSettings
) -> billing_schemas.WhatIfRead:
    return billing_usage.what_if_table(session, v.customer, period.name, now, config)


def capped_rows(table: billing_schemas.WhatIfRead) -> list[billing_schemas.WhatIfRowRead]:
    """The rows whose difference is smaller than their credits: a monthly cap held the bill
    without credits down too."""
    return [r for r in table.rows if Decimal(r.difference) < -Decimal(r.credits)]


def all_customers(session: Session) -> list[Customer]:
    """The admin's customer picker."""
    return list(session.scalars(customers_query()))


def shift_period(name: str, months: int) -> str:
    index = int(name[:4]) * 12 + int(name[5:]) - 1 + months
    return f"{index // 12:04d}-{index % 12 + 1:02d}"


def customer_name(session: Session, customer_id: uuid.UUID | None) -> str:
    """The customer's name, for pages that name one the viewer may not be signed in to."""
    customer = None if customer_id is None else customer_by_id(session, customer_id)
    return "a customer that no longer exists" if customer is None else customer.name


@dataclass(frozen=True)
class BudgetsView:
    statuses: list[BudgetStatus]  # each budget against the current month's spend
    rentals: dict[uuid.UUID, str]  # the month's rentals a budget may name, with their labels
    period: BillingPeriod


def budgets_view(session: Session, v: Viewer, now: datetime, config: UsageSettings) -> BudgetsView:
    """The budgets page: each budget's status this month, and the rentals one may cover."""
    period = period_of(v.customer, None, now)
    usage = budgets.current_spend(session, v.customer, now, config)
    statuses = budgets.status(budgets.budgets_of(session, v.customer), usage)
    start, end = (datetime.fromtimestamp(t, UTC) for t in period.span)
    labels = rental_labels.labels_overlapping(session, v.customer.id, start, end, v.fmt)
    named = {s.budget.rental_id for s in statuses if s.budget.rental_id is not None}
    labels |= rental_labels.labels(session, v.customer.id, named - labels.keys(), v.fmt)
    return BudgetsView(statuses, labels, period)


def customer_budget(session: Session, v: Viewer, budget_id: uuid.UUID) -> Budget:
    """One of the viewed customer's budgets; another customer's is a 404 (even to an admin
    looking at this one)."""
    budget = budgets.get_budget(session, budget_id, v.principal)
    if budget.customer_id != v.customer.id:
        raise not_found("budget", budget_id)
    return budget
