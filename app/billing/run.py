"""The invoice run: every customer's draft (and optionally its finalization) for one period.

Idempotent: each customer's draft is rebuilt in place from current data, so running again
gives the same drafts and never duplicates; finalized and paid invoices are left untouched.
A run is judged at ``now``, which ``as_of`` (API field, ``--as-of``) may set to a past time
for re-runs and backfills: grace, vouchers, ``generated_at``/``finalized_at`` follow it; the
usage rated is the data stored now (late data is what adjustments are for).
Customers are grouped by billing time zone (each zone has its own calendar month); each group
loads its rating inputs in a few set-based queries. A customer whose data the run cannot bill
(no price in effect, a plan in another currency, an amount too large for an invoice, a row the
database cannot give back) is rolled back alone, reported with its reason, and the rest of the
run goes on: customers are billed in savepoints of ``SAVEPOINT_CUSTOMERS`` (a savepoint per
customer cost ~2.4 ms each on a loaded box), and a savepoint where one failed is billed again
one customer per savepoint; when the group's read itself fails on one customer's row, each
customer of the group is read alone. The caller owns the transaction (the CLI, the API and the
scheduled run: one per run).
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from sqlalchemy import text
from sqlalchemy.exc import DataError
from sqlalchemy.orm import Session

from app.billing.loader import PERIOD_PATTERN, BillingPeriod, started_period
from app.billing.models import InvoiceStatus
from app.billing.service import (
    BillingSettings,
    Draft,
    DraftBatch,
    check_grace,
    draft_batch,
    finalize_invoice,
    refresh_draft,
)
from app.core.errors import ApiError, Unprocessable, not_found
from app.core.memory import rare_collections
from app.customers.models import Customer
from app.customers.service import customers_by_zone

Progress = Callable[[int, int], None]  # (customers done, customers in the run)
log = logging.getLogger(__name__)

# What one customer's data can raise: refused by the core or the service (ApiError), a value the
# database cannot store or give back (DataError), arithmetic out of range. Anything else (the
# database gone, a bug) fails the run as a whole.
CustomerFault = (ApiError, DataError, ArithmeticError, ValueError)
# Customers billed in one savepoint while none fails (a failure re-bills them one by one).
SAVEPOINT_CUSTOMERS = 50


class Outcome(StrEnum):
    DRAFTED = "drafted"
    FINALIZED = "finalized"
    UNCHANGED = "unchanged"  # already finalized or paid: never touched
    EMPTY = "empty"  # nothing to bill
    FAILED = "failed"


@dataclass
class RunSummary:
    period: str
    customers: int
    counts: Counter[Outcome] = field(default_factory=Counter)
    failures: dict[uuid.UUID, str] = field(default_factory=dict)
    invoice_ids: list[uuid.UUID] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def done(self) -> int:
        return sum(self.counts.values())

    def line(self) -> str:
        counts = ", ".join(f"{self.counts[o]} {o.value}" for o in Outcome)
        return f"period {self.period}: {self.customers} customers: {counts} in {self.seconds:.2f} s"


def as_of_time(as_of: datetime | None, now: datetime, loc: tuple[str, ...]) -> datetime:
    """The time a run is judged at: ``as_of`` (a re-run or backfill, reproducible: grace,
    voucher validity, ``generated_at``, ``finalized_at`` and the numbers' year are taken at
    it), never later than ``now``; None means now."""
    if as_of is None:
        return now
    if as_of > now:
        raise Unprocessable(f"as_of {as_of.isoformat()} is in the future", loc)
    return as_of


def run_invoices(
    session: Session,
    period: str,
    now: datetime,
    *,
    config: BillingSettings,
    customer_id: uuid.UUID | None = None,
    timezone: str | None = None,
    finalize: bool = False,
    force: bool = False,
    progress: Progress | None = None,
) -> RunSummary:
    """Every customer's invoice for ``period`` (only ``customer_id``'s, or only those billed in
    ``timezone``: the scheduled run's zone-month)."""
    started = time.perf_counter()
    if not re.match(PERIOD_PATTERN, period):
        raise Unprocessable(f"period must be YYYY-MM, got {period!r}", ("body", "period"))
    zones = _customers_by_zone(session, customer_id, timezone)
    periods = {zone: started_period(period, zone, now, ("body", "period")) for zone in zones}
    if finalize:  # refuse the whole run up front, not customer by customer
        for zone_period in periods.values():
            check_grace(period, zone_period.end, now, force, config)
    summary = RunSummary(period, customers=sum(len(c) for c in zones.values()))
    # The run writes thousands of invoices and lines in one transaction. Cached generic plans
    # (psycopg prepares a statement after 5 runs; plpgsql caches its triggers' plans) are fixed
    # while these tables are still small, and keep scanning them whole as they grow: the run
    # went quadratic. Planning each statement for the tables as they are keeps it linear.
    session.execute(text("SET LOCAL plan_cache_mode = force_custom_plan"))
    run = _Run(session, now, config, finalize, force, summary, progress)
    with rare_collections():
        for zone, customers in zones.items():
            run.zone(customers, periods[zone])
    summary.seconds = time.perf_counter() - started
    return summary


@dataclass(frozen=True)
class _Run:
    session: Session
    now: datetime
    config: BillingSettings
    finalize: bool
    force: bool
    summary: RunSummary
    progress: Progress | None

    def zone(self, customers: Sequence[Customer], period: BillingPeriod) -> None:
        """The zone's customers from one batch read; when the read fails on some customer's
        row, each customer alone, to bill the others and report whose it was."""
        try:
            with self.session.begin_nested():
                batch = draft_batch(self.session, customers, period, self.now, self.config)
        except CustomerFault as error:
            if len(customers) == 1:
                self._done(customers[0], None, error)
                return
            for customer in customers:
                self.zone([customer], period)
            return
        for first in range(0, len(customers), SAVEPOINT_CUSTOMERS):
            self._chunk(customers[first : first + SAVEPOINT_CUSTOMERS], period, batch)

    def _chunk(
        self, customers: Sequence[Customer], period: BillingPeriod, batch: DraftBatch
    ) -> None:
        """The customers in one savepoint; when one of them fails, the savepoint is rolled back
        and each customer is billed again in a savepoint of its own, so the failure is rolled
        back alone (a savepoint costs a round trip or two: one per customer made runs slower)."""
        if len(customers) > 1:
            try:
                with self.session.begin_nested():
                    drafts = [self._bill(customer, period, batch) for customer in customers]
            except CustomerFault:
                pass  # whose it was, and only that, is found one by one below
            else:
                for customer, draft in zip(customers, drafts, strict=True):
                    self._done(customer, draft)
                return
        for customer in customers:
            try:
                with self.session.begin_nested():
                    draft = self._bill(customer, period, batch)
            except CustomerFault as error:
                self._done(customer, None, error)
            else:
                self._done(customer, draft)

    def _bill(self, customer: Customer, period: BillingPeriod, batch: DraftBatch) -> Draft | None:
        draft = refresh_draft(self.session, customer, period, self.now, batch)
        if draft is not None and self.finalize and _outcome(draft) is Outcome.DRAFTED:
            finalize_invoice(self.session, draft, self.now, self.config, force=self.force)
        return draft

    def _done(
        self, customer: Customer, draft: Draft | None, error: Exception | None = None
    ) -> None:
        summary = self.summary
        if error is not None:
            summary.counts[Outcome.FAILED] += 1
            summary.failures[customer.id] = _reason(error)
            log.warning(
                "invoice run skipped a customer",
                extra={"customer_id": str(customer.id), "reason": summary.failures[customer.id]},
            )
        else:
            summary.counts[_outcome(draft)] += 1
            if draft is not None:
                summary.invoice_ids.append(draft.invoice.id)
        if self.progress:
            self.progress(summary.done, summary.customers)


def _reason(error: Exception) -> str:
    if isinstance(error, ApiError):
        return str(error.items[0]["msg"])
    if isinstance(error, DataError):  # written (numeric overflow) or read (a year Python lacks)
        first = str(error.orig).splitlines()[0] if error.orig else "out of range"
        return f"a value the database cannot store or give back: {first}"
    return f"{type(error).__name__}: {error}"


def _outcome(draft: Draft | None) -> Outcome:
    if draft is None:
        return Outcome.EMPTY
    return {
        InvoiceStatus.DRAFT: Outcome.DRAFTED,
        InvoiceStatus.FINALIZED: Outcome.FINALIZED if draft.built else Outcome.UNCHANGED,
    }.get(draft.invoice.status, Outcome.UNCHANGED)


def _customers_by_zone(
    session: Session, customer_id: uuid.UUID | None, timezone: str | None
) -> dict[str, list[Customer]]:
    zones: dict[str, list[Customer]] = defaultdict(list)
    for customer in customers_by_zone(session, customer_id, timezone):
        zones[customer.billing_timezone].append(customer)
    if customer_id is not None and not zones:
        raise not_found("customer", customer_id, ("body", "customer_id"))
    return zones
