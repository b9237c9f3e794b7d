"""Live views for the dashboard: cost to date with buckets and effective GPU-hours, a month-end
forecast, the voucher ledger, and the what-if table. Closed days and the open day's
closed hours come from their stored rollups (``rollups``: re-rated first when their inputs
changed), the rest of the open day is rated live.

Cost to date is rated as the invoice would be (credits and the cap included), with the cap
prorated over the whole billing period's seconds, not the days so far: the allowance earned
to date (``RatedRental.cap_allowance``) is shown per rental, and cost to date never exceeds it.

Forecast: ``FORECAST_ASSUMES`` (per rental: ``_forecast``; the month's additions: ``_growth``).
So a steady rental forecasts its full month, a failure burst lowers it by the seconds credited
so far only, a rental's booked end stops it there, a customer adding GPUs day by day is
forecast to go on adding them, and the forecast meets the invoice at period end.
``bench/forecast.py`` measures it against final invoices.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from fractions import Fraction
from typing import TypeVar

from sqlalchemy.orm import Session

from app.billing import repository, rollups
from app.billing.core.domain import Bucket, RentalInput
from app.billing.core.effective import EffectiveUsage, effective_of, minute_spans
from app.billing.core.lines import LineKind
from app.billing.core.rating import RatedRental
from app.billing.core.vouchers import balance, open_vouchers, usable
from app.billing.core.whatif import DEFAULT_INCREMENTS, WhatIfCell, what_if_rated
from app.billing.loader import (
    BillingPeriod,
    PeriodInputs,
    current_period,
    load_inputs,
    started_period,
)
from app.billing.models import InvoiceLineRow
from app.billing.schemas import (
    EffectiveRead,
    OpenVoucherRead,
    RentalUsageRead,
    UsageRead,
    VoucherEntryRead,
    VoucherLedgerRead,
    WhatIfCellRead,
    WhatIfRead,
    WhatIfRowRead,
    money,
)
from app.billing.service import core_errors, ledger
from app.core.epoch import epoch, from_epoch
from app.core.memory import rare_collections
from app.core.money import round_money
from app.customers.models import Customer
from app.metering.reads import idle_minutes
from app.settings import Settings

T = TypeVar("T")
FORECAST_ASSUMES = (
    "the cost so far, plus every running rental's GPUs at the current price until the month "
    "ends (or the rental's scheduled end), with no further failures credited and the monthly "
    "cap applied as on the invoice; rentals without an end started this month keep being "
    "added at the pace they were so far"
)
# The credits the what-if compares against a manual process (``whatif``'s rule).
_AUTOMATIC = frozenset({LineKind.FAILURE_CREDIT, LineKind.MIGRATION_CREDIT, LineKind.STALL_CREDIT})


@dataclass(frozen=True)
class UsageSettings:
    """The settings the usage views follow, handed in by their callers."""

    # A GPU minute below this utilisation is idle (tenths of a percent: utilisation is a
    # measurement, not money, and tenths are precise enough).
    idle_below_tenths: int
    manual_recovery_s: int  # the what-if's manual process takes at least this long

    @classmethod
    def of(cls, settings: Settings) -> UsageSettings:
        return cls(round(settings.idle_util_threshold_percent * 10), settings.manual_recovery_s)


def usage(
    session: Session, customer: Customer, period_name: str, now: datetime, config: UsageSettings
) -> UsageRead:
    return usage_and_rated(session, customer, period_name, now, config)[0]


def usage_and_rated(
    session: Session, customer: Customer, period_name: str, now: datetime, config: UsageSettings
) -> tuple[UsageRead, list[RatedRental]]:
    """The usage and the rentals rated to date it was computed from (the overview's amount
    due previews an invoice from them instead of rating the month again)."""
    period, span = _to_date(customer, period_name, now)
    to_date = rated_to_date(session, customer, period, span, config)
    rated = to_date.rated
    currency, zero = customer.currency, Decimal(0)
    forecasts = [_forecast(r, span[1], period.span[1], currency) for r in rated]
    growth = round_money(_growth(rated, period.span, span[1]), currency)
    effective = [effective_of(r, to_date.idle_s[r.rental.rental_id]) for r in rated]
    read = UsageRead(
        customer_id=customer.id,
        period=period.name,
        period_start=period.start,
        period_end=period.end,
        as_of=from_epoch(span[1]),
        currency=customer.currency,
        buckets_s=_buckets(rated),
        effective=_effective(sum(effective, EffectiveUsage(0, 0, 0))),
        cost_to_date=money(sum((r.net for r in rated), zero), currency),
        forecast=money(sum((f.amount for f in forecasts), growth), currency),
        forecast_new_rentals=money(growth, currency),
        forecast_is_cap=any(f.is_cap for f in forecasts),
        vouchers=voucher_ledger(session, customer, now),
        rentals=[
            _rental_usage(r, e, f, span[1])
            for r, e, f in zip(rated, effective, forecasts, strict=True)
        ],
    )
    return read, rated


def what_if_table(
    session: Session, customer: Customer, period_name: str, now: datetime, config: UsageSettings
) -> WhatIfRead:
    period, span = _to_date(customer, period_name, now)
    to_date = rated_to_date(session, customer, period, span, config)
    recovery = config.manual_recovery_s
    with core_errors(customer):
        rated = {increment: to_date.rerated(increment) for increment in DEFAULT_INCREMENTS}
        table = what_if_rated(rated, manual_recovery_s=recovery, currency=customer.currency)
    currency = customer.currency

    def credits(increment: int) -> str:
        lines = (line for r in rated[increment] for line in r.lines)
        return money(sum((x.amount for x in lines if x.kind in _AUTOMATIC), Decimal(0)), currency)

    def cell(c: WhatIfCell) -> WhatIfCellRead:
        return WhatIfCellRead(amount=money(c.amount, currency), billed_s=c.billed_s)

    rows = [
        WhatIfRowRead(
            increment_s=row.increment_s,
            with_credits=cell(row.with_credits),
            without_credits=cell(row.without_credits),
            difference=money(row.difference, currency),
            credits=credits(row.increment_s),
        )
        for row in table.rows
    ]
    return WhatIfRead(
        customer_id=customer.id,
        period=period.name,
        currency=currency,
        manual_recovery_s=recovery,
        rows=rows,
    )


def rated_to_date(
    session: Session,
    customer: Customer,
    period: BillingPeriod,
    span: tuple[int, int],
    config: UsageSettings,
) -> rollups.ToDate:
    """The period to date: stored spans from their rollups, the rest rated live."""
    return _from_inputs(session, customer, period, span, rollups.rated_to_date, config)


def lines_to_date(
    session: Session,
    customer: Customer,
    period: BillingPeriod,
    now: datetime,
    config: UsageSettings,
) -> list[InvoiceLineRow]:
    """The period to date's lines (charges, credits, caps) as unsaved invoice line rows: what
    the exports write for a period the invoice run has not drafted yet."""
    span = (period.span[0], min(period.span[1], epoch(now)))
    rated = rated_to_date(session, customer, period, span, config).rated
    return [
        InvoiceLineRow(
            kind=line.kind.value,
            amount=line.amount,
            rental_id=None if line.rental_id is None else uuid.UUID(line.rental_id),
            gpu_model=line.gpu_model,
            gpu_uuid=line.gpu_uuid,
            start_at=None if line.start is None else from_epoch(line.start),
            end_at=None if line.end is None else from_epoch(line.end),
            seconds=line.seconds,
            rate=line.rate,
            evidence=line.evidence,
        )
        for r in rated
        for line in r.lines
    ]


def store_closed(
    session: Session, customer: Customer, now: datetime, config: UsageSettings
) -> None:
    """Store the rollups of the customer's current period's closed days and hours
    (``rollups.stored_spans``) where missing or stale, so that no reader pays for it."""
    period, span = _to_date(customer, current_period(customer.billing_timezone, now), now)
    _from_inputs(session, customer, period, span, rollups.store_closed, config)


def _from_inputs(
    session: Session,
    customer: Customer,
    period: BillingPeriod,
    span: tuple[int, int],
    step: Callable[[Session, uuid.UUID, BillingPeriod, int, PeriodInputs, rollups.IdleReader], T],
    config: UsageSettings,
) -> T:
    """A rollups step over the customer's inputs loaded for ``span``, up to its end."""
    with rare_collections():  # the rating and the reads behind it allocate by the million
        inputs = load_inputs(session, [customer.id], span)
        with core_errors(customer):
            reader = _idle_reader(session, config.idle_below_tenths)
            return step(session, customer.id, period, span[1], inputs, reader)


def _idle_reader(session: Session, below_tenths: int) -> rollups.IdleReader:
    def read_idle(gpus: Sequence[str], part: tuple[int, int]) -> dict[str, list[tuple[int, int]]]:
        with rare_collections():  # also when called later, for the open day (``ToDate``)
            return idle_by_gpu(session, gpus, part, below_tenths)

    return read_idle


def voucher_ledger(session: Session, customer: Customer, now: datetime) -> VoucherLedgerRead:
    entries_of = repository.voucher_entries(session, [customer.id]).get(customer.id, [])
    rows = [e for e in entries_of if e.currency == customer.currency]
    entries = ledger(rows)
    still_open = sorted(open_vouchers(entries), key=lambda v: (v.expires_at, v.voucher_id))
    currency = customer.currency
    return VoucherLedgerRead(
        customer_id=customer.id,
        currency=currency,
        balance=money(balance(entries), currency),
        usable=money(usable(still_open, epoch(now)), currency),
        open=[
            OpenVoucherRead(
                voucher_id=v.voucher_id,
                expires_at=from_epoch(v.expires_at),
                remaining=money(v.remaining, currency),
            )
            for v in still_open
        ],
        entries=[VoucherEntryRead.of(row) for row in rows],
    )


def _to_date(
    customer: Customer, period_name: str, now: datetime
) -> tuple[BillingPeriod, tuple[int, int]]:
    period = started_period(period_name, customer.billing_timezone, now, ("query", "period"))
    return period, (period.span[0], min(period.span[1], epoch(now)))


def idle_by_gpu(
    session: Session, gpus: Sequence[str], span: tuple[int, int], below_tenths: int
) -> dict[str, list[tuple[int, int]]]:
    """Each GPU's idle spans: its minutes under ``below_tenths`` (``UsageSettings``)."""
    idle = idle_minutes(session, gpus, *span, below_tenths)
    return {gpu: minute_spans(minutes) for gpu, minutes in idle.items()}


def _rental_usage(
    rated: RatedRental, effective: EffectiveUsage, forecast: Forecast, as_of: int
) -> RentalUsageRead:
    rental, currency = rated.rental, rated.rental.plan.currency
    return RentalUsageRead(
        rental_id=uuid.UUID(rental.rental_id),
        gpu_model=rental.gpu_model,
        gpu_count=rental.gpu_count,
        running=rental.rental_end is None or rental.rental_end > as_of,
        buckets_s={b.value: s for b, s in rated.buckets.items()},
        billed_s=rated.billed_s,
        effective=_effective(effective),
        cost_to_date=money(rated.net, currency),
        cap_allowance=None if rated.cap_allowance is None else money(rated.cap_allowance, currency),
        forecast=money(forecast.amount, currency),
        forecast_is_cap=forecast.is_cap,
    )


@dataclass(frozen=True)
class Forecast:
    amount: Decimal
    is_cap: bool  # the cap allowance, extrapolated, is what the rental is forecast to cost


def _forecast(rated: RatedRental, as_of: int, period_end: int, currency: str) -> Forecast:
    """``FORECAST_ASSUMES``: the cost to date, plus each running rental's GPUs at the price
    (and cap share) in effect over the rest of its time in the period, as if nothing more
    failed; the smaller of the uncapped and the capped projection, rounded once."""
    rental = rated.rental
    start, end = max(as_of, rental.rental_start), rental.end_by(period_end)
    if start >= end:
        return Forecast(rated.net, rated.net < rated.uncapped_net)
    charge, cap = _still_to_come(rental, start, end, rated.period_s)
    projected = Fraction(rated.uncapped_net) + charge
    if rated.cap_allowance is not None and cap is not None:
        capped = Fraction(rated.cap_allowance) + cap
        if capped < projected:
            return Forecast(round_money(capped, currency), True)
    return Forecast(round_money(projected, currency), False)


def _still_to_come(
    rental: RentalInput, start: int, end: int, period_s: int
) -> tuple[Fraction, Fraction | None]:
    """The rental's charge over [start, end) at its plan's prices, and its cap allowance over
    the same seconds (None where a price in it has no cap)."""
    points = rental.plan.price_points(rental.gpu_model)
    charge, cap = Fraction(0), Fraction(0) if period_s else None
    for point, following in zip(points, [*points[1:], None], strict=True):
        until = end if following is None else min(end, following.effective_from)
        seconds = until - max(start, point.effective_from)
        if seconds <= 0:
            continue
        gpu_seconds = seconds * rental.gpu_count
        charge += Fraction(point.price_per_hour) * gpu_seconds / 3600
        if cap is not None and point.monthly_cap_per_gpu is not None:
            cap += Fraction(point.monthly_cap_per_gpu) * gpu_seconds / period_s
        else:
            cap = None
    return charge, cap


def _growth(rated: Sequence[RatedRental], period: tuple[int, int], as_of: int) -> Fraction:
    """New rentals at the month's pace so far. The open-ended rentals that started after the
    period's first second and still run are the month's additions; from the second on, each
    adds its GPUs' rate (price, or cap share where lower) over the time since the first (one
    addition alone is no pace). That pace, kept up over the R seconds left, adds
    pace x R^2 / 2: each new GPU runs from its start to the period's end."""
    left = period[1] - as_of
    added = sorted(
        (r.rental.rental_start, _rate_at(r, as_of))
        for r in rated
        if r.rental.rental_end is None and period[0] < r.rental.rental_start <= as_of
    )
    if len(added) < 2 or left <= 0 or added[-1][0] == added[0][0]:
        return Fraction(0)
    pace = sum((rate for _, rate in added[1:]), Fraction(0)) / (added[-1][0] - added[0][0])
    return pace * left * left / 2


def _rate_at(rated: RatedRental, moment: int) -> Fraction:
    """The rental's cost per second at ``moment``: its price, or its cap share where lower."""
    charge, cap = _still_to_come(rated.rental, moment, moment + 1, rated.period_s)
    return charge if cap is None else min(charge, cap)


def _buckets(rated: Sequence[RatedRental]) -> dict[str, int]:
    return {b.value: sum(r.buckets[b] for r in rated) for b in Bucket}


def _effective(usage: EffectiveUsage) -> EffectiveRead:
    return EffectiveRead(
        rented_s=usage.rented_s,
        credited_s=usage.credited_s,
        idle_s=usage.idle_s,
        unmeasured_s=usage.unmeasured_s,
        effective_s=usage.effective_s,
        effective_gpu_hours=str(usage.effective_gpu_hours),
    )
