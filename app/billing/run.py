"""The invoice run: every customer's draft (and optionally its finalization) for one period.

Idempotent: each customer's draft is rebuilt in place from current data, so running again
gives the same drafts and never duplicates; finalized and paid invoices are left untouched.
A run is judged at ``now``, which ``as_of`` (API field, ``--as-of``) may set to a past time
for re-runs and backfills: grace, vouchers, ``generated_at``/``finalized_at`` follow it; the
usage rated is the data stored now (late data is what adjustments are for).
Customers are grouped by billing time zone (each zone has its own calendar month); each group
loads its rating inputs in a few set-based queries. A customer whose configuration the core
rejects (no price in effect, a plan in another currency) is reported and skipped; the rest of
the run goes on. The caller owns the transaction (the CLI and the API: one per run).
"""

from __future__ import annotations

import re
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from sqlalchemy import text
from sqlalchemy.orm import Session

from app.billing.loader import PERIOD_PATTERN, BillingPeriod, started_period
from app.billing.models import InvoiceStatus
from app.billing.service import (
    BillingSettings,
    Draft,
    check_grace,
    draft_batch,
    finalize_invoice,
    refresh_draft,
)
from app.core.errors import Unprocessable, not_found
from app.core.memory import rare_collections
from app.customers.models import Customer
from app.customers.service import customers_by_zone

Progress = Callable[[int, int], None]  # (customers done, customers in the run)


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
    finalize: bool = False,
    force: bool = False,
    progress: Progress | None = None,
) -> RunSummary:
    started = time.perf_counter()
    if not re.match(PERIOD_PATTERN, period):
        raise Unprocessable(f"period must be YYYY-MM, got {period!r}", ("body", "period"))
    zones = _customers_by_zone(session, customer_id)
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
    with rare_collections():
        for zone, customers in zones.items():
            _run_zone(
                session, customers, periods[zone], now, config, finalize, force, summary, progress
            )
    summary.seconds = time.perf_counter() - started
    return summary


def _run_zone(
    session: Session,
    customers: Sequence[Customer],
    period: BillingPeriod,
    now: datetime,
    config: BillingSettings,
    finalize: bool,
    force: bool,
    summary: RunSummary,
    progress: Progress | None,
) -> None:
    batch = draft_batch(session, customers, period, now, config)
    for customer in customers:
        try:  # a customer the core rejects fails before anything of it is written
            draft = refresh_draft(session, customer, period, now, batch)
            outcome = _outcome(draft)
            if draft is not None and finalize and outcome is Outcome.DRAFTED:
                finalize_invoice(session, draft, now, config, force=force)
                outcome = Outcome.FINALIZED
        except Unprocessable as error:
            outcome, draft = Outcome.FAILED, None
            summary.failures[customer.id] = error.items[0]["msg"]
        summary.counts[outcome] += 1
        if draft is not None:
            summary.invoice_ids.append(draft.invoice.id)
        if progress:
            progress(summary.done, summary.customers)


def _outcome(draft: Draft | None) -> Outcome:
    if draft is None:
        return Outcome.EMPTY
    return Outcome.DRAFTED if draft.invoice.status == InvoiceStatus.DRAFT else Outcome.UNCHANGED


def _customers_by_zone(
    session: Session, customer_id: uuid.UUID | None
) -> dict[str, list[Customer]]:
    zones: dict[str, list[Customer]] = defaultdict(list)
    for customer in customers_by_zone(session, customer_id):
        zones[customer.billing_timezone].append(customer)
    if customer_id is not None and not zones:
        raise not_found("customer", customer_id, ("body", "customer_id"))
    return zones
