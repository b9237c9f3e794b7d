"""Cost explorer: money per day (charges, the monthly cap's reduction, credits, net), grouped
by rental, GPU model or datacenter, over a month or a custom range of days.

Read-only, from the same rating of each period to date as the usage API (closed days from their
stored rollups, the open day rated live; ``billing.usage.rated_to_date``), so a month's totals
are the usage API's and, for a closed month, the invoice's. A range of days is cut from the
months it touches. Money per day is an allocation, documented here because a day is not a
billing unit: each charge and cap line is spread over the days of its rental in proportion to
the seconds it charges in each day (billed and credited ones: an unbilled second, unmetered or
in maintenance, belongs to its own day, so a day's charge is its GPU-hours x the rate, to the
cent where that is a whole number of cents), each credit line over the days of its own span in
proportion to its bucket's seconds there, both by largest remainder (``exports.allocate``), so
the days add up exactly to the rental's cost. By datacenter, a rental's share of a day is split
again by the seconds its GPU assignments spent in each datacenter that day. Idle GPU-hours are
billable seconds in minutes below the idle threshold (the usage API's effective hours).
"""

from __future__ import annotations

import uuid
from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from decimal import Decimal
from enum import StrEnum
from zoneinfo import ZoneInfo

from sqlalchemy.orm import Session

from app.billing.core.domain import CREDIT_BUCKETS, Bucket
from app.billing.core.lines import InvoiceLine, LineKind
from app.billing.core.rating import RatedRental, is_billed
from app.billing.loader import BillingPeriod
from app.billing.rollups import day_bounds
from app.billing.schemas import money
from app.billing.usage import UsageSettings, rated_to_date
from app.core.epoch import epoch, from_epoch
from app.core.errors import Unprocessable
from app.core.schemas import Schema
from app.customers.models import Customer
from app.dashboard import rental_labels
from app.dashboard.exports import allocate
from app.dashboard.formatting import Formatter
from app.fleet import reads as fleet_reads
from app.rentals.reads import served

MAX_RANGE_DAYS = 92  # a custom range rates each month it touches: at most five
_BILLED = {Bucket.BILLABLE, Bucket.DEGRADED}
KIND_ORDER = [kind.value for kind in LineKind]  # the columns of the per-group table
_CREDIT_BUCKET = {
    LineKind.FAILURE_CREDIT: Bucket.FAILURE_CREDIT,
    LineKind.MIGRATION_CREDIT: Bucket.MIGRATION_CREDIT,
    LineKind.DEGRADED_CREDIT: Bucket.DEGRADED_CREDIT,
    LineKind.STALL_CREDIT: Bucket.STALL_CREDIT,
}
_CREDIT_LINES = set(_CREDIT_BUCKET)
_UNPLACED = "unassigned"  # a rental's share of a day no GPU assignment of it covers


class GroupBy(StrEnum):
    RENTAL = "rental"
    GPU_MODEL = "gpu_model"
    DATACENTER = "datacenter"


class DayRead(Schema):
    day: date
    billed_s: int  # billable and degraded seconds, idle ones included
    credited_s: int
    idle_s: int  # of billed_s: billable seconds in minutes below the idle threshold
    charged: str  # GPU time charged, before the cap and credits
    cap: str  # the monthly cap's reduction spread over the day (0 or negative)
    credited: str  # failure, migration and degraded credits (0 or negative)
    net: str
    by_group: dict[str, str]  # group key -> net


class GroupCostRead(Schema):
    key: str  # a rental id, a GPU model or a datacenter
    label: str  # what a person calls it (a rental: its name, else its GPUs and dates)
    by_kind: dict[str, str]  # line kind -> amount over the range
    net: str


class CostsRead(Schema):
    customer_id: uuid.UUID
    currency: str
    as_of: datetime
    period: str | None  # the month asked for, None for a custom range
    start: date  # first day shown (customer's time zone)
    end: date  # last day shown, at most today
    group_by: GroupBy
    days: list[DayRead]
    groups: list[GroupCostRead]
    net: str


@dataclass(frozen=True)
class DayRange:
    """Inclusive local days, and the months (billing periods) they fall in."""

    first: date
    last: date
    periods: list[BillingPeriod]
    month: str | None  # the whole month was asked for by name


def day_range(
    customer: Customer,
    month: BillingPeriod | None,
    start: date | None,
    end: date | None,
    now: datetime,
    period_of: Callable[[str], BillingPeriod],
) -> DayRange:
    """The days asked for: a month (``month``, the default), or ``start``..``end``, each
    checked with a 422 that says what is wrong; an end after today is cut to today."""
    today = now.astimezone(ZoneInfo(customer.billing_timezone)).date()
    if start is None and end is None:
        assert month is not None
        last = min(_local(month.span[1] - 1, month), today)
        return DayRange(_local(month.span[0], month), last, [month], month.name)
    if month is not None:
        raise Unprocessable("give either period or start and end, not both", ("query", "period"))
    if start is None or end is None:
        missing = "start" if start is None else "end"
        raise Unprocessable("a range needs both start and end (YYYY-MM-DD)", ("query", missing))
    if start > end:
        raise Unprocessable(f"start {start} is after end {end}", ("query", "start"))
    if (end - start).days + 1 > MAX_RANGE_DAYS:
        raise Unprocessable(
            f"a range is at most {MAX_RANGE_DAYS} days; {start} to {end} is "
            f"{(end - start).days + 1}",
            ("query", "end"),
        )
    if start > today:
        raise Unprocessable(f"start {start} is after today ({today})", ("query", "start"))
    if start.year < 1970:
        raise Unprocessable(f"start {start} is before 1970", ("query", "start"))
    last = min(end, today)
    months = sorted({f"{start + timedelta(days=n):%Y-%m}" for n in range((last - start).days + 1)})
    return DayRange(start, last, [period_of(name) for name in months], None)


def _local(moment: int, period: BillingPeriod) -> date:
    return from_epoch(moment).astimezone(ZoneInfo(period.timezone)).date()


@dataclass
class _Totals:
    """Seconds and money per local day, money also per group and line kind."""

    seconds: dict[date, dict[str, int]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(int))
    )
    money: dict[date, dict[str, dict[LineKind, Decimal]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(lambda: defaultdict(Decimal)))
    )
    labels: dict[str, str] = field(default_factory=dict)


def costs_and_rated(
    session: Session,
    customer: Customer,
    days: DayRange,
    group_by: GroupBy,
    now: datetime,
    config: UsageSettings,
) -> tuple[CostsRead, list[RatedRental]]:
    """The costs, and the rentals of the last month they touch rated to date (a month's page
    previews its amount due from them instead of rating the month again)."""
    currency = customer.currency
    fmt = Formatter(currency, customer.billing_timezone)
    totals = _Totals()
    rated: list[RatedRental] = []
    for period in days.periods:
        rated = _add_period(session, customer, period, now, group_by, fmt, totals, config)
    shown = [days.first + timedelta(days=n) for n in range((days.last - days.first).days + 1)]
    as_of = min(epoch(now), max(p.span[1] for p in days.periods))
    by_group: dict[str, dict[LineKind, Decimal]] = defaultdict(lambda: defaultdict(Decimal))
    for day in shown:
        for key, kinds in totals.money[day].items():
            for kind, amount in kinds.items():
                by_group[key][kind] += amount
    if group_by is GroupBy.RENTAL:
        named = rental_labels.labels(session, customer.id, [uuid.UUID(k) for k in by_group], fmt)
        totals.labels.update({str(rental_id): label for rental_id, label in named.items()})
    groups = sorted(by_group.items(), key=lambda g: (-sum(g[1].values()), totals.labels[g[0]]))
    read = CostsRead(
        customer_id=customer.id,
        currency=currency,
        as_of=from_epoch(as_of),
        period=days.month,
        start=days.first,
        end=days.last,
        group_by=group_by,
        days=[_day(day, totals, currency) for day in shown],
        groups=[
            GroupCostRead(
                key=key,
                label=totals.labels[key],
                by_kind={k.value: money(v, currency) for k, v in sorted(kinds.items())},
                net=money(sum(kinds.values(), Decimal(0)), currency),
            )
            for key, kinds in groups
        ],
        net=money(sum((sum(k.values(), Decimal(0)) for _, k in groups), Decimal(0)), currency),
    )
    return read, rated


def _day(day: date, totals: _Totals, currency: str) -> DayRead:
    seconds, groups = totals.seconds[day], totals.money[day]
    kinds: dict[LineKind, Decimal] = defaultdict(Decimal)
    for amounts in groups.values():
        for kind, amount in amounts.items():
            kinds[kind] += amount
    credited = sum((kinds[k] for k in _CREDIT_LINES), Decimal(0))
    return DayRead(
        day=day,
        billed_s=seconds["billed"],
        credited_s=seconds["credited"],
        idle_s=seconds["idle"],
        charged=money(kinds[LineKind.CHARGE], currency),
        cap=money(kinds[LineKind.CAP], currency),
        credited=money(credited, currency),
        net=money(sum(kinds.values(), Decimal(0)), currency),
        by_group={key: money(sum(a.values(), Decimal(0)), currency) for key, a in groups.items()},
    )


def _add_period(
    session: Session,
    customer: Customer,
    period: BillingPeriod,
    now: datetime,
    group_by: GroupBy,
    fmt: Formatter,
    totals: _Totals,
    config: UsageSettings,
) -> list[RatedRental]:
    """Adds the period's days to ``totals``; returns its rentals rated to date."""
    span = (period.span[0], min(period.span[1], epoch(now)))
    to_date = rated_to_date(session, customer, period, span, config)
    bounds = day_bounds(period)
    n = len(bounds) - 1
    dates = [_local(t, period) for t in bounds[:-1]]
    per_rental: dict[str, dict[Bucket, list[int]]] = defaultdict(
        lambda: defaultdict(lambda: [0] * n)
    )
    for part in to_date.by_day:
        per_rental[part.rental_id][part.bucket][part.day] += part.seconds
        day = totals.seconds[dates[part.day]]
        day["idle"] += part.idle_s
        if part.bucket in _BILLED:
            day["billed"] += part.seconds
        elif part.bucket in CREDIT_BUCKETS:
            day["credited"] += part.seconds
    where = _places(session, customer, period, bounds) if group_by is GroupBy.DATACENTER else {}
    for r in to_date.rated:
        rid = r.rental.rental_id
        by_bucket = per_rental[rid]
        charging = [
            seconds
            for bucket, seconds in by_bucket.items()
            if bucket in CREDIT_BUCKETS or is_billed(bucket, r.rental.plan)
        ]
        charged = [sum(day) for day in zip(*charging, strict=True)] if charging else []
        split = _splitter(r, group_by, where.get(rid), fmt, totals.labels)
        for line in r.lines:
            for i, share in _spread(line, charged, by_bucket, bounds, customer.currency):
                for key, amount in split(i, share):
                    totals.money[dates[i]][key][line.kind] += amount
    return list(to_date.rated)


def _splitter(
    r: RatedRental,
    group_by: GroupBy,
    places: dict[int, dict[str, int]] | None,
    fmt: Formatter,
    labels: dict[str, str],
) -> Callable[[int, Decimal], list[tuple[str, Decimal]]]:
    """How one rental's share of a day goes to its group(s), naming each group on the way."""
    rental = r.rental
    if group_by is GroupBy.RENTAL:  # costs_and_rated names the rentals, all in one query
        return lambda _, share: [(rental.rental_id, share)]
    if group_by is GroupBy.GPU_MODEL:
        labels[rental.gpu_model] = rental.gpu_model
        return lambda _, share: [(rental.gpu_model, share)]
    per_day = places or {}
    overall: dict[str, int] = defaultdict(int)
    for seconds in per_day.values():
        for dc, s in seconds.items():
            overall[dc] += s
    for dc in [*overall] or [_UNPLACED]:
        labels[dc] = dc

    def by_datacenter(i: int, share: Decimal) -> list[tuple[str, Decimal]]:
        weights = per_day.get(i) or overall or {_UNPLACED: 1}
        names = sorted(weights)
        parts = allocate(share, [weights[dc] for dc in names], fmt.currency)
        return list(zip(names, parts, strict=True))

    return by_datacenter


def _places(
    session: Session, customer: Customer, period: BillingPeriod, bounds: Sequence[int]
) -> dict[str, dict[int, dict[str, int]]]:
    """Per rental, per day of the period: the seconds its GPU assignments spent in each
    datacenter."""
    start, end = from_epoch(period.span[0]), from_epoch(period.span[1])
    rows = session.execute(served(customer_id=customer.id, start=start, end=end)).all()
    places = fleet_reads.gpu_places(session, {row[2] for row in rows})
    dc = {gpu: datacenter for gpu, (_, datacenter) in places.items()}
    out: dict[str, dict[int, dict[str, int]]] = defaultdict(lambda: defaultdict(dict))
    for rental_id, _, gpu, a_start, a_end in rows:
        lo = max(epoch(a_start), bounds[0])
        hi = min(bounds[-1] if a_end is None else epoch(a_end), bounds[-1])
        for i in range(max(bisect_right(bounds, lo) - 1, 0), bisect_left(bounds, hi)):
            seconds = min(hi, bounds[i + 1]) - max(lo, bounds[i])
            if seconds > 0:
                day = out[str(rental_id)][i]
                day[dc[gpu]] = day.get(dc[gpu], 0) + seconds
    return out


def _spread(
    line: InvoiceLine,
    charged: list[int],
    by_bucket: dict[Bucket, list[int]],
    days: Sequence[int],
    currency: str,
) -> list[tuple[int, Decimal]]:
    """A credit line over the days of its span, in proportion to its bucket's seconds there
    (to the span's own length where the rating placed them elsewhere); any other line over
    the rental's charged (billed and credited) seconds per day."""
    if line.kind in _CREDIT_LINES and line.start is not None and line.end is not None:
        start, end = line.start, max(line.end, line.start + 1)
        touched = range(max(bisect_right(days, start) - 1, 0), bisect_left(days, end))
        credited = by_bucket.get(_CREDIT_BUCKET[line.kind])
        weights = [(i, credited[i]) for i in touched if credited and credited[i]]
        if not weights:
            weights = [(i, min(end, days[i + 1]) - max(start, days[i])) for i in touched]
        return _shares(line.amount, weights, currency)
    return _shares(line.amount, [(i, s) for i, s in enumerate(charged) if s], currency)


def _shares(
    amount: Decimal, weights: list[tuple[int, int]], currency: str
) -> list[tuple[int, Decimal]]:
    if not weights:
        return []
    shares = allocate(amount, [w for _, w in weights], currency)
    return [(i, share) for (i, _), share in zip(weights, shares, strict=True)]


# --- the chart ----------------------------------------------------------------------------

MAX_DAY_TICKS = 7  # more days than this are labelled a week apart
CHART_SERIES = 6  # groups drawn in their own colour; the rest are drawn together as "Other"


@dataclass(frozen=True)
class Segment:
    series: int  # index into the legend (the last one is "Other" when there are more groups)
    height: float  # percent of the axis top


@dataclass(frozen=True)
class Bar:
    """One day's stacked bar of net money by group (heights in percent of the axis top)."""

    day: DayRead
    x: float
    segments: list[Segment]


@dataclass(frozen=True)
class Chart:
    bars: list[Bar]
    ticks: list[tuple[float, str]]  # day labels (percent of the width, MM-DD), a week apart
    legend: list[str]
    top: Decimal  # the axis top, a round amount
    capped: bool  # some day's charges were lowered by a monthly cap


def chart(data: CostsRead) -> Chart:
    """Net money per day, stacked by the biggest groups (a day's negative net is drawn as 0)."""
    drawn = [g.key for g in data.groups[:CHART_SERIES]]
    legend = [g.label for g in data.groups[:CHART_SERIES]]
    if len(data.groups) > CHART_SERIES:
        legend.append("Other")
    series = {key: i for i, key in enumerate(drawn)}
    stacks = []
    for d in data.days:
        heights: dict[int, Decimal] = defaultdict(Decimal)
        for key, amount in d.by_group.items():
            heights[series.get(key, CHART_SERIES)] += Decimal(amount)
        stacks.append({s: h for s, h in heights.items() if h > 0})
    top = _round_up(max((sum(s.values(), Decimal(0)) for s in stacks), default=Decimal(0)))
    width = 100 / max(1, len(data.days))
    bars = [
        Bar(
            d,
            round(i * width, 3),
            [Segment(s, round(float(h / top * 100), 3)) for s, h in sorted(stacks[i].items())],
        )
        for i, d in enumerate(data.days)
    ]
    step = 7 if len(bars) > MAX_DAY_TICKS else 1
    ticks = [(b.x + width / 2, f"{b.day.day:%m-%d}") for b in bars[::step]]
    return Chart(bars, ticks, legend, top, any(Decimal(d.cap) for d in data.days))


def _round_up(amount: Decimal) -> Decimal:
    """The smallest of 1, 2, 2.5 and 5 times a power of ten at or above ``amount`` (at least 1)."""
    if amount <= 1:
        return Decimal(1)
    scale = Decimal(10) ** (len(str(int(amount))) - 1)
    return next(
        step * scale
        for step in (Decimal(1), Decimal(2), Decimal("2.5"), Decimal(5), Decimal(10))
        if step * scale >= amount
    )
