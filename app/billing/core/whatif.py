"""What-if: the same usage rated at several increments, with and without automatic credits.

API:
    what_if(inputs, increments=(1, 60, 3600), manual_recovery_s=2820, cap_period=None)
        -> WhatIfTable
    what_if_rated({increment: [RatedRental]}, manual_recovery_s=2820) -> WhatIfTable

Rules:
* "With credits" is the real rating (``rate_rentals``) with the increment swapped in:
  amount = what the invoice charges for the rentals (charges, credits and the cap).
  "Without credits" keeps the charge lines (which already include failed, migration and
  stalled seconds), drops the failure/migration/stall credit lines, and adds a downtime
  top-up per incident (a stalled GPU's wait is one too: without automatic credits the job
  waits for the manual recovery on every GPU). ``degraded_credit`` is a plan price rule,
  not an automatic credit, so it stays in both columns.
* The cap applies in both columns, each by its own rule: with credits, the allowance is
  earned by billed seconds only (``rating``'s cap rule); without automatic credits, the
  downtime is billed, so it earns allowance too. A capped customer thus sees in both
  columns what they would be invoiced, and the difference is what the credits save them.
* A downtime incident is a maximal contiguous run of failure and migration-window seconds
  on one GPU, so a failure and the migration window right after it form one incident.
  Billed downtime = max(incident seconds, ``manual_recovery_s``): the top-up
  (manual_recovery_s - incident seconds, if positive) is priced at the incident's last
  second, rounded as its own line and not subject to increments.
* A session none of whose seconds was billed costs nothing with credits (no minimum:
  ``rating``). Without automatic credits its downtime is billed, so the increment and the
  minimum apply to it like to any session (its top-ups count towards the minimum), priced at
  its last downtime second: there the two columns differ by more than the downtime.
* Amounts exclude vouchers and tax, which would mask the comparison.
"""

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from decimal import Decimal

from app.billing.core.domain import DOWNTIME_BUCKETS, Bucket, Piece, RatingInputs
from app.billing.core.intervals import Span
from app.billing.core.lines import LineKind, sum_amounts
from app.billing.core.rating import RatedRental, cap_allowance, is_billed, price_at, rate_rentals
from app.core.money import time_amount

DEFAULT_MANUAL_RECOVERY_S = 47 * 60
DEFAULT_INCREMENTS = (1, 60, 3600)

_DOWNTIME = DOWNTIME_BUCKETS
_KEPT_WITHOUT_CREDITS = frozenset({LineKind.CHARGE, LineKind.DEGRADED_CREDIT})


@dataclass(frozen=True)
class WhatIfCell:
    amount: Decimal
    billed_s: int


@dataclass(frozen=True)
class WhatIfRow:
    increment_s: int
    with_credits: WhatIfCell
    without_credits: WhatIfCell

    @property
    def difference(self) -> Decimal:
        """What automatic credits save the customer at this increment."""
        return self.without_credits.amount - self.with_credits.amount


@dataclass(frozen=True)
class WhatIfTable:
    currency: str
    rows: tuple[WhatIfRow, ...]


def what_if(
    inputs: RatingInputs,
    increments: Sequence[int] = DEFAULT_INCREMENTS,
    manual_recovery_s: int = DEFAULT_MANUAL_RECOVERY_S,
    cap_period: Span | None = None,
) -> WhatIfTable:
    currencies = {r.plan.currency for r in inputs.rentals}
    if len(currencies) > 1:
        raise ValueError(f"what-if needs a single currency, got {sorted(currencies)}")
    rated = {
        increment: rate_rentals(
            replace(
                inputs,
                rentals=[
                    replace(r, plan=replace(r.plan, increment_s=increment)) for r in inputs.rentals
                ],
            ),
            cap_period,
        )
        for increment in increments
    }
    return what_if_rated(rated, manual_recovery_s, currencies.pop() if currencies else "USD")


def what_if_rated(
    rated_by_increment: Mapping[int, Sequence[RatedRental]],
    manual_recovery_s: int = DEFAULT_MANUAL_RECOVERY_S,
    currency: str | None = None,
) -> WhatIfTable:
    """The table from the rentals already rated at each increment (e.g. from rollups)."""
    currencies = {r.rental.plan.currency for rs in rated_by_increment.values() for r in rs}
    if len(currencies) > 1:
        raise ValueError(f"what-if needs a single currency, got {sorted(currencies)}")
    currency = currencies.pop() if currencies else currency or "USD"
    rows = tuple(
        WhatIfRow(
            increment,
            _with_credits(rated, currency),
            _without_credits(rated, currency, manual_recovery_s),
        )
        for increment, rated in rated_by_increment.items()
    )
    return WhatIfTable(currency, rows)


def _with_credits(rated: Sequence[RatedRental], currency: str) -> WhatIfCell:
    amount = sum((r.net for r in rated), sum_amounts((), currency))
    return WhatIfCell(amount, sum(r.billed_s for r in rated))


def _without_credits(
    rated: Sequence[RatedRental], currency: str, manual_recovery_s: int
) -> WhatIfCell:
    amount, seconds = sum_amounts((), currency), 0
    for r in rated:
        lines = [line for line in r.lines if line.kind in _KEPT_WITHOUT_CREDITS]
        cost = sum_amounts(lines, currency)
        seconds += r.billed_s + sum(r.buckets[b] for b in _DOWNTIME)
        for start, end in _incidents(r.pieces):
            top_up = max(manual_recovery_s - (end - start), 0)
            seconds += top_up
            cost += time_amount(top_up, price_at(r.rental, end - 1), currency)
        for extra_s, priced_at in _minimums(r, manual_recovery_s):
            seconds += extra_s
            cost += time_amount(extra_s, price_at(r.rental, priced_at), currency)
        amount += _capped(r, cost)
    return WhatIfCell(amount, seconds)


def _minimums(rated: RatedRental, manual_recovery_s: int) -> Iterator[tuple[int, int]]:
    """(seconds, priced at) that the increment and the minimum add, without automatic credits,
    to each session none of whose seconds was billed. With credits such a session bills
    nothing, no minimum (``rating``); billed its downtime, it is rounded like any session, its
    incidents' top-ups counting towards the minimum. Sessions with billed seconds were rounded
    with their credited seconds already, so their charge lines hold for both columns."""
    plan = rated.rental.plan
    for session in rated.sessions:
        if session.billed_s:
            continue
        # The downtime runs that begin in the session, whole: stored rollups cut a run at each
        # day, and a run (a migration's wait) may outlast the session it began in.
        gpu_pieces = [p for p in rated.pieces if p.gpu_uuid == session.gpu_uuid]
        down = [run for run in _incidents(gpu_pieces) if session.start <= run[0] < session.end]
        down_s = sum(end - start for start, end in down)
        top_ups = sum(max(manual_recovery_s - (end - start), 0) for start, end in down)
        rounded_s = max(-(-down_s // plan.increment_s) * plan.increment_s, plan.minimum_s)
        if down_s and (extra_s := rounded_s - down_s - top_ups) > 0:
            yield extra_s, max(end for _, end in down) - 1


def _capped(rated: RatedRental, cost: Decimal) -> Decimal:
    """``cost`` held to the allowance the rental earns when its downtime is billed too."""
    plan = rated.rental.plan
    earning = {b for b in Bucket if is_billed(b, plan)} | _DOWNTIME
    allowance = cap_allowance(rated, earning)
    return cost if allowance is None else min(cost, allowance)


def _incidents(pieces: Sequence[Piece]) -> Iterator[Span]:
    """Contiguous downtime runs on one GPU; ``pieces`` are sorted by (gpu, start)."""
    run: tuple[str, int, int] | None = None
    for p in pieces:
        if p.bucket not in _DOWNTIME:
            continue
        if run and run[0] == p.gpu_uuid and run[2] == p.start:
            run = (run[0], run[1], p.end)
            continue
        if run:
            yield run[1:]
        run = (p.gpu_uuid, p.start, p.end)
    if run:
        yield run[1:]
