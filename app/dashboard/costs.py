"""Cost explorer: the period day by day (billed, credited and idle GPU-hours, billed and
credited money) and each rental's cost broken down by invoice line kind.

Read-only, from the same rating of the period to date as the usage API (closed days from their
stored rollups, the open day rated live; ``billing.usage.rated_to_date``), so its totals are the
usage API's and, for a closed month, the invoice's. Money per day is an allocation, documented
here because a day is not a billing unit: each charge and cap line is spread over the days of
its rental in proportion to the rental's rented seconds in each day, each credit line over the
days of its own span in proportion to its bucket's seconds there, both by largest remainder
(``exports.allocate``), so the days add up exactly to the rental's cost. Idle GPU-hours are
billable seconds in minutes below the idle threshold (the usage API's effective hours).
"""

from __future__ import annotations

import uuid
from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from itertools import pairwise
from zoneinfo import ZoneInfo

from sqlalchemy.orm import Session

from app.billing.core.domain import CREDIT_BUCKETS, Bucket
from app.billing.core.lines import InvoiceLine, LineKind
from app.billing.core.rating import RatedRental
from app.billing.loader import BillingPeriod
from app.billing.rollups import day_bounds
from app.billing.schemas import money
from app.billing.usage import rated_to_date
from app.core.epoch import epoch, from_epoch
from app.core.schemas import Schema
from app.customers.models import Customer
from app.dashboard.exports import allocate

_BILLED = {Bucket.BILLABLE, Bucket.DEGRADED}
KIND_ORDER = [kind.value for kind in LineKind]  # the columns of the per-rental table
_CREDIT_BUCKET = {
    LineKind.FAILURE_CREDIT: Bucket.FAILURE_CREDIT,
    LineKind.MIGRATION_CREDIT: Bucket.MIGRATION_CREDIT,
    LineKind.DEGRADED_CREDIT: Bucket.DEGRADED_CREDIT,
}
_CREDIT_LINES = set(_CREDIT_BUCKET)


class DayRead(Schema):
    day: date
    billed_s: int  # billable and degraded seconds, idle ones included
    credited_s: int
    idle_s: int  # of billed_s: billable seconds in minutes below the idle threshold
    billed: str  # charges and cap, before credits
    credited: str  # negative


class RentalCostRead(Schema):
    rental_id: uuid.UUID
    gpu_model: str
    gpu_count: int
    by_kind: dict[str, str]  # line kind -> amount
    net: str


class CostsRead(Schema):
    customer_id: uuid.UUID
    period: str
    currency: str
    as_of: datetime
    days: list[DayRead]
    rentals: list[RentalCostRead]
    net: str


def costs(session: Session, customer: Customer, period: BillingPeriod, now: datetime) -> CostsRead:
    span = (period.span[0], min(period.span[1], epoch(now)))
    to_date = rated_to_date(session, customer, period, span)
    days = day_bounds(period)
    currency = customer.currency
    n = len(days) - 1
    seconds = {k: [0] * n for k in ("billed", "credited", "idle")}
    amounts = {k: [Decimal(0)] * n for k in ("billed", "credited")}
    per_rental: dict[str, dict[Bucket, list[int]]] = defaultdict(
        lambda: defaultdict(lambda: [0] * n)
    )
    for part in to_date.by_day:
        per_rental[part.rental_id][part.bucket][part.day] += part.seconds
        seconds["idle"][part.day] += part.idle_s
        if part.bucket in _BILLED:
            seconds["billed"][part.day] += part.seconds
        elif part.bucket in CREDIT_BUCKETS:
            seconds["credited"][part.day] += part.seconds
    for r in to_date.rated:
        by_bucket = per_rental[r.rental.rental_id]
        rented = [sum(day) for day in zip(*by_bucket.values(), strict=True)] if by_bucket else []
        for line in r.lines:
            kind, shares = _spread(line, rented, by_bucket, days, currency)
            for i, share in shares:
                amounts[kind][i] += share
    today = [i for i, (a, _) in enumerate(pairwise(days)) if a < span[1]]
    return CostsRead(
        customer_id=customer.id,
        period=period.name,
        currency=currency,
        as_of=from_epoch(span[1]),
        days=[
            DayRead(
                day=from_epoch(days[i]).astimezone(ZoneInfo(period.timezone)).date(),
                billed_s=seconds["billed"][i],
                credited_s=seconds["credited"][i],
                idle_s=seconds["idle"][i],
                billed=money(amounts["billed"][i], currency),
                credited=money(amounts["credited"][i], currency),
            )
            for i in today
        ],
        rentals=[_rental(r, currency) for r in to_date.rated],
        net=money(sum((r.net for r in to_date.rated), Decimal(0)), currency),
    )


def _spread(
    line: InvoiceLine,
    rented: list[int],
    by_bucket: dict[Bucket, list[int]],
    days: Sequence[int],
    currency: str,
) -> tuple[str, list[tuple[int, Decimal]]]:
    """A credit line over the days of its span, in proportion to its bucket's seconds there
    (to the span's own length where the rating placed them elsewhere); any other line over
    the rental's rented seconds per day."""
    if line.kind in _CREDIT_LINES and line.start is not None and line.end is not None:
        start, end = line.start, max(line.end, line.start + 1)
        touched = range(max(bisect_right(days, start) - 1, 0), bisect_left(days, end))
        credited = by_bucket.get(_CREDIT_BUCKET[line.kind])
        weights = [(i, credited[i]) for i in touched if credited and credited[i]]
        if not weights:
            weights = [(i, min(end, days[i + 1]) - max(start, days[i])) for i in touched]
        return "credited", _shares(line.amount, weights, currency)
    return "billed", _shares(line.amount, [(i, s) for i, s in enumerate(rented) if s], currency)


def _shares(
    amount: Decimal, weights: list[tuple[int, int]], currency: str
) -> list[tuple[int, Decimal]]:
    if not weights:
        return []
    shares = allocate(amount, [w for _, w in weights], currency)
    return [(i, share) for (i, _), share in zip(weights, shares, strict=True)]


def _rental(r: RatedRental, currency: str) -> RentalCostRead:
    by_kind: defaultdict[str, Decimal] = defaultdict(Decimal)
    for line in r.lines:
        by_kind[line.kind.value] += line.amount
    return RentalCostRead(
        rental_id=uuid.UUID(r.rental.rental_id),
        gpu_model=r.rental.gpu_model,
        gpu_count=r.rental.gpu_count,
        by_kind={k: money(v, currency) for k, v in by_kind.items()},
        net=money(r.net, currency),
    )


@dataclass(frozen=True)
class Bar:
    """One day's stacked bar (heights in percent of the tallest day)."""

    day: DayRead
    x: float
    busy: float
    idle: float
    credited: float


def bars(days: list[DayRead]) -> tuple[list[Bar], int]:
    """Bars for the chart and the axis top (whole GPU-hours, at least 1)."""
    tallest = max((d.billed_s + d.credited_s for d in days), default=0)
    top_h = max(1, -(-tallest // 3600))
    scale = 100 / (top_h * 3600)
    width = 100 / max(1, len(days))
    return [
        Bar(
            d,
            round(i * width, 3),
            round((d.billed_s - d.idle_s) * scale, 3),
            round(d.idle_s * scale, 3),
            round(d.credited_s * scale, 3),
        )
        for i, d in enumerate(days)
    ], top_h
