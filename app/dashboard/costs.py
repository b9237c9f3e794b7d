"""Cost explorer: the period day by day (billed, credited and idle GPU-hours, billed and
credited money) and each rental's cost broken down by invoice line kind.

Read-only, from billing's own rating of the period to date (the same rating as the usage API
and the invoice). Money per day is an allocation, documented here because a day is not a
billing unit: each charge and cap line is spread over the days of its rental in proportion to
the rental's rented seconds in each day, each credit line over the days of its own span, both
by largest remainder (``exports.allocate``), so the days add up exactly to the rental's cost.
Idle GPU-hours are billable seconds in minutes below the idle threshold (as the usage API's
effective hours).
"""

from __future__ import annotations

import uuid
from bisect import bisect_right
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from itertools import pairwise
from zoneinfo import ZoneInfo

from sqlalchemy.orm import Session

from app.billing.domain import CREDIT_BUCKETS, Bucket
from app.billing.lines import InvoiceLine, LineKind
from app.billing.loader import BillingPeriod, load_inputs
from app.billing.rating import RatedRental
from app.billing.schemas import money
from app.billing.service import core_errors, rate
from app.billing.usage import idle_by_gpu
from app.core.epoch import epoch, from_epoch
from app.core.schemas import Schema
from app.customers.models import Customer
from app.dashboard.exports import allocate, day_bounds

Span = tuple[int, int]
_BILLED = {Bucket.BILLABLE, Bucket.DEGRADED}
KIND_ORDER = [kind.value for kind in LineKind]  # the columns of the per-rental table
_CREDIT_LINES = {LineKind.FAILURE_CREDIT, LineKind.MIGRATION_CREDIT, LineKind.DEGRADED_CREDIT}


class DayRead(Schema):
    day: date
    billed_s: int  # billable and degraded seconds, idle ones included
    credited_s: int
    idle_s: int  # of billed_s: minutes below the idle threshold
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
    inputs = load_inputs(session, [customer.id], span)
    with core_errors(customer):
        rated = rate(inputs, customer.id, period.span)
    idle = idle_by_gpu(session, inputs.gpus, span)
    days = day_bounds(period)
    currency = customer.currency
    seconds: dict[str, list[int]] = {
        k: [0] * (len(days) - 1) for k in ("billed", "credited", "idle")
    }
    amounts: dict[str, list[Decimal]] = {
        k: [Decimal(0)] * (len(days) - 1) for k in ("billed", "credited")
    }
    for r in rated:
        rented = [0] * (len(days) - 1)
        for piece in r.pieces:
            for i, part in _by_day((piece.start, piece.end), days):
                rented[i] += part[1] - part[0]
                if piece.bucket in _BILLED:
                    seconds["billed"][i] += part[1] - part[0]
                    seconds["idle"][i] += _overlap(part, idle.get(piece.gpu_uuid, ()))
                elif piece.bucket in CREDIT_BUCKETS:
                    seconds["credited"][i] += part[1] - part[0]
        for line in r.lines:
            kind, shares = _spread(line, rented, days, currency)
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
        rentals=[_rental(r, currency) for r in rated],
        net=money(sum((r.net for r in rated), Decimal(0)), currency),
    )


def _by_day(span: Span, days: Sequence[int]) -> list[tuple[int, Span]]:
    """``span`` cut at the day bounds: (day index, part) for each day it touches."""
    lo, hi = span
    first = max(bisect_right(days, lo) - 1, 0)
    out = []
    for i in range(first, len(days) - 1):
        if days[i] >= hi:
            break
        part = (max(lo, days[i]), min(hi, days[i + 1]))
        if part[0] < part[1]:
            out.append((i, part))
    return out


def _overlap(span: Span, spans: Sequence[Span]) -> int:
    return sum(max(0, min(b, span[1]) - max(a, span[0])) for a, b in spans if a < span[1])


def _spread(
    line: InvoiceLine, rented: list[int], days: Sequence[int], currency: str
) -> tuple[str, list[tuple[int, Decimal]]]:
    if line.kind in _CREDIT_LINES and line.start is not None and line.end is not None:
        parts = _by_day((line.start, max(line.end, line.start + 1)), days)
        weights = [b - a for _, (a, b) in parts]
        shares = allocate(line.amount, weights, currency)
        return "credited", [(i, s) for (i, _), s in zip(parts, shares, strict=True)]
    used = [i for i, s in enumerate(rented) if s]
    if not used:
        return "billed", []
    shares = allocate(line.amount, [rented[i] for i in used], currency)
    return "billed", list(zip(used, shares, strict=True))


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
