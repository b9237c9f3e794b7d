"""Load the pure rating core's inputs from the database, in a handful of set-based queries.

Everything is loaded for a set of customers that share one period (the same time zone), so
an invoice run over the whole fleet costs a few queries per time zone, not per customer.
Database times (timestamptz) become integer UTC epoch seconds here and nowhere else.

API:
    BillingPeriod, billing_period(period, timezone) -> BillingPeriod
    started_period(period, timezone, now, loc) -> BillingPeriod   # 422 if not started by now
    current_period(timezone, now) -> str
    PeriodInputs, load_inputs(session, customer_ids, span, rental_ids=None) -> PeriodInputs
"""

from __future__ import annotations

import re
import uuid
from collections import defaultdict
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import TypeVar
from zoneinfo import ZoneInfo

from sqlalchemy.orm import Session

from app.billing.core.domain import (
    Assignment,
    Migration,
    PlanTerms,
    PricePoint,
    RatingInputs,
    RentalInput,
    Segment,
    VoucherTier,
)
from app.billing.core.intervals import Span
from app.core.epoch import epoch, from_epoch
from app.core.errors import Unprocessable
from app.fleet import reads as fleet_reads
from app.metering.reads import segments_between
from app.plans import reads as plans_reads
from app.plans.service import price_schedule
from app.rentals import reads as rentals_reads
from app.rentals.reads import served
from metering_agent.protocol import GpuState

_T = TypeVar("_T", Assignment, Migration)

# Years 1970-2999: every month of them starts and ends within datetime's and the epoch's range.
PERIOD_PATTERN = r"^(19[7-9]\d|2\d{3})-(0[1-9]|1[0-2])$"


@dataclass(frozen=True)
class BillingPeriod:
    """A calendar month in a time zone: ``name`` "YYYY-MM", ``span`` in UTC epoch seconds."""

    name: str
    timezone: str
    span: Span

    @property
    def start(self) -> datetime:
        return from_epoch(self.span[0])

    @property
    def end(self) -> datetime:
        return from_epoch(self.span[1])


def billing_period(period: str, timezone: str) -> BillingPeriod:
    if not re.match(PERIOD_PATTERN, period):
        raise ValueError(f"period must be YYYY-MM from 1970-01 to 2999-12, got {period!r}")
    year, month = int(period[:4]), int(period[5:])
    zone = ZoneInfo(timezone)
    start = datetime(year, month, 1, tzinfo=zone)
    end = datetime(year + month // 12, month % 12 + 1, 1, tzinfo=zone)
    return BillingPeriod(period, timezone, (epoch(start), epoch(end)))


def started_period(
    period: str, timezone: str, now: datetime, loc: tuple[str, ...]
) -> BillingPeriod:
    """The period, refused (422 at ``loc``) when it has not started by ``now``."""
    bounds = billing_period(period, timezone)
    if bounds.start > now:
        raise Unprocessable(f"period {period} has not started yet", loc)
    return bounds


def current_period(timezone: str, now: datetime) -> str:
    return now.astimezone(ZoneInfo(timezone)).strftime("%Y-%m")


@dataclass
class PeriodInputs:
    """The core's inputs for some customers over one span; ``rentals_of`` groups by customer."""

    span: Span
    rentals_of: dict[uuid.UUID, list[RentalInput]] = field(default_factory=dict)
    assignments: list[Assignment] = field(default_factory=list)
    segments_by_gpu: dict[str, list[Segment]] = field(default_factory=dict)
    maintenance_by_gpu: dict[str, list[Span]] = field(default_factory=dict)
    migrations: list[Migration] = field(default_factory=list)
    # Rating one customer must not scan every customer's rows (quadratic over a run).
    assignments_by_customer: dict[uuid.UUID, list[Assignment]] = field(default_factory=dict)
    migrations_by_customer: dict[uuid.UUID, list[Migration]] = field(default_factory=dict)

    def rentals(self, customer_id: uuid.UUID) -> list[RentalInput]:
        return self.rentals_of.get(customer_id, [])

    def assignments_of(self, customer_id: uuid.UUID) -> list[Assignment]:
        return self.assignments_by_customer.get(customer_id, [])

    def migrations_of(self, customer_id: uuid.UUID) -> list[Migration]:
        return self.migrations_by_customer.get(customer_id, [])

    def for_customer(self, customer_id: uuid.UUID, span: Span | None = None) -> RatingInputs:
        """The core's inputs for one customer's rentals, over ``span`` (default: the whole)."""
        return RatingInputs(
            self.rentals(customer_id),
            self.assignments_of(customer_id),
            self.segments_by_gpu,
            self.maintenance_by_gpu,
            self.migrations_of(customer_id),
            span or self.span,
        )

    @property
    def gpus(self) -> list[str]:
        return sorted({a.gpu_uuid for a in self.assignments})


def load_inputs(
    session: Session,
    customer_ids: Collection[uuid.UUID],
    span: Span,
    rental_ids: Collection[uuid.UUID] | None = None,
) -> PeriodInputs:
    """Rentals of ``customer_ids`` overlapping ``span`` (optionally only ``rental_ids``)."""
    inputs = PeriodInputs(span)
    rentals = rentals_reads.rentals_overlapping(
        session, customer_ids, from_epoch(span[0]), from_epoch(span[1]), rental_ids
    )
    if not rentals:
        return inputs
    plans = _PlanBook(session, customer_ids)
    for rental in rentals:
        inputs.rentals_of.setdefault(rental.customer_id, []).append(
            RentalInput(
                str(rental.id),
                str(rental.customer_id),
                rental.gpu_model,
                rental.gpu_count,
                epoch(rental.start_at),
                None if rental.end_at is None else epoch(rental.end_at),
                plans.terms(
                    rental.plan_id, rental.gpu_model, rental.customer_id, rental.preemptible
                ),
            )
        )
    ids = [r.id for r in rentals]
    inputs.assignments = _assignments(session, ids, span)
    inputs.migrations = _migrations(session, ids, span)
    customer_of = {str(r.id): r.customer_id for r in rentals}
    inputs.assignments_by_customer = _group(inputs.assignments, customer_of)
    inputs.migrations_by_customer = _group(inputs.migrations, customer_of)
    gpus = inputs.gpus
    inputs.segments_by_gpu = {
        gpu: [Segment(s.gpu_uuid, s.start, s.end, GpuState(s.state), s.evidence) for s in rows]
        for gpu, rows in segments_between(session, gpus, *span).items()
    }
    inputs.maintenance_by_gpu = _maintenance(session, gpus, span)
    return inputs


def _group(items: Iterable[_T], customer_of: dict[str, uuid.UUID]) -> dict[uuid.UUID, list[_T]]:
    groups: dict[uuid.UUID, list[_T]] = defaultdict(list)
    for item in items:
        groups[customer_of[item.rental_id]].append(item)
    return dict(groups)


def _assignments(session: Session, rental_ids: list[uuid.UUID], span: Span) -> list[Assignment]:
    query = served(rental_ids=rental_ids, start=from_epoch(span[0]), end=from_epoch(span[1]))
    rows = session.execute(query)
    # An open assignment runs to the period end; the core clips to the rental anyway.
    return [
        Assignment(str(r), gpu, epoch(s), span[1] if e is None else epoch(e))
        for r, _, gpu, s, e in rows
    ]


def _migrations(session: Session, rental_ids: list[uuid.UUID], span: Span) -> list[Migration]:
    rows = rentals_reads.migrations_overlapping(
        session, rental_ids, from_epoch(span[0]), from_epoch(span[1])
    )
    return [
        Migration(
            str(m.rental_id),
            m.from_gpu_uuid,
            m.to_gpu_uuid,
            epoch(m.failed_at),
            epoch(m.resumed_at),
            # What the customer may read: the GPUs and the reason; no internal ids.
            {"from_gpu": m.from_gpu_uuid, "to_gpu": m.to_gpu_uuid, "reason": m.reason},
        )
        for m in rows
    ]


def _maintenance(session: Session, gpus: list[str], span: Span) -> dict[str, list[Span]]:
    rows = fleet_reads.maintenance_spans(session, gpus, from_epoch(span[0]), from_epoch(span[1]))
    out: dict[str, list[Span]] = defaultdict(list)
    for gpu, start, end in rows:
        out[gpu].append((epoch(start), span[1] if end is None else epoch(end)))
    return dict(out)


class _PlanBook:
    """Plan terms per (plan, model, customer), each distinct price schedule loaded once:
    customers without a contract price on a plan share its base schedule."""

    def __init__(self, session: Session, customer_ids: Collection[uuid.UUID]) -> None:
        self._session = session
        self._terms: dict[tuple[uuid.UUID, str, uuid.UUID | None, bool], PlanTerms] = {}
        self._overridden = plans_reads.contract_priced(session, customer_ids)

    def terms(
        self, plan_id: uuid.UUID, gpu_model: str, customer_id: uuid.UUID, preemptible: bool
    ) -> PlanTerms:
        """A preemptible rental is rated at the plan's preemptible prices."""
        own = customer_id if (plan_id, customer_id) in self._overridden else None
        key = (plan_id, gpu_model, own, preemptible)
        if key not in self._terms:
            self._terms[key] = self._load(plan_id, gpu_model, customer_id, preemptible)
        return self._terms[key]

    def _load(
        self, plan_id: uuid.UUID, gpu_model: str, customer_id: uuid.UUID, preemptible: bool
    ) -> PlanTerms:
        plan = plans_reads.plan_by_id(self._session, plan_id)
        schedule = price_schedule(
            self._session, plan_id, gpu_model, customer_id, preemptible=preemptible
        )
        return PlanTerms(
            prices=tuple(
                PricePoint(gpu_model, epoch(at), price, cap) for at, price, cap in schedule
            ),
            currency=plan.currency,
            increment_s=plan.increment_s,
            minimum_s=plan.minimum_s,
            bill_degraded=plan.bill_degraded,
            bill_unmetered=plan.bill_unmetered,
            credit_stall=plan.credit_stall,
            voucher_tiers=tuple(
                VoucherTier(int(t["min_days"]), Decimal(str(t["percent"])))
                for t in plan.voucher_tiers
            ),
            voucher_validity_days=plan.voucher_validity_days,
        )
