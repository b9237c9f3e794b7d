"""Stored rollups of rated usage: closed days are read from storage, the open day is rated live.

A closed local day's rollup is rating's own output: the pieces ``rate_rentals`` gives for the
period up to that day's end, cut at the day's bounds and at price changes, each stored with its
bucket, the price point in effect and its idle seconds (billable seconds in minutes below the
idle threshold, as ``effective_usage`` counts them). Pieces are time-local (a second's bucket
depends only on that second's inputs), so the parts of a day rated once equal the parts of the
same day in any longer rating. A read adds the open day's pieces (rated live, from its start)
and hands all of them to ``rating.rate_pieces``, which forms sessions (increments, minimums),
charge, credit and cap lines by the same code as the invoice: no second formula. Each
(rental, GPU, bucket, price point) of the stored days comes back as one summed piece placed at
the end of its parts (so it stays in its price period and session, and its last second is the
last billed one); downtime pieces (failure and migration credits) come back as stored, for the
what-if's incidents. Credit lines of such a rating keep the invoice's totals, not its per-
incident split; the invoice itself always rates from the raw inputs.

Freshness: each stored day keeps a fingerprint of its inputs clipped to the day: segments
(so late telemetry that creates or changes a segment touching a closed day; a segment merely
extended past the day leaves the day's fingerprint alone), assignments, migrations, maintenance
and each rental's terms and plan. A read computes the fingerprints from the inputs it loads
anyway (one pass, with range sums for the days an item covers whole) and re-rates the stale or
missing days first. Not covered: late minute metrics for a closed hour without a segment change
(idle seconds stay as first stored; agents send both together).

API:
    day_bounds(period) -> [int]          # local midnights in the period, then its end
    rated_to_date(session, customer_id, period, as_of, inputs, read_idle) -> ToDate
"""

from __future__ import annotations

import hashlib
import uuid
from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from functools import cached_property
from itertools import pairwise
from zoneinfo import ZoneInfo

from sqlalchemy.orm import Session

from app.billing import repository
from app.billing.domain import Bucket, Piece, RentalInput
from app.billing.effective import overlap
from app.billing.intervals import Span
from app.billing.loader import BillingPeriod, PeriodInputs
from app.billing.rating import (
    RatedRental,
    rate_pieces,
    rate_rentals,
    rental_bounds,
    session_runs,
)
from app.core.epoch import epoch, from_epoch

DOWNTIME = frozenset({Bucket.FAILURE_CREDIT, Bucket.MIGRATION_CREDIT})
_MASK = (1 << 64) - 1


def day_bounds(period: BillingPeriod) -> list[int]:
    """The local midnights of ``period``'s days (DST-aware), then the period's end."""
    zone = ZoneInfo(period.timezone)
    day = from_epoch(period.span[0]).astimezone(zone).replace(hour=0, minute=0, second=0)
    bounds = []
    while (t := epoch(day)) < period.span[1]:
        bounds.append(t)
        day += timedelta(days=1)  # wall-clock arithmetic: the next local midnight, DST or not
    return [*bounds, period.span[1]]


@dataclass(frozen=True)
class Part:
    """A rated piece of one rental on one GPU, within one day and one price period."""

    rental_id: str
    gpu_uuid: str
    start: int
    end: int
    bucket: Bucket
    price_from: int
    idle_s: int


@dataclass(frozen=True)
class DaySeconds:
    """A rental's seconds in one bucket on one day of the period (an index into
    ``day_bounds``), and the idle seconds among them (billable seconds in idle minutes)."""

    rental_id: str
    day: int
    bucket: Bucket
    seconds: int
    idle_s: int


@dataclass(frozen=True)
class ToDate:
    """The period to date rated from rollups and the open day, with each rental's seconds
    per day and bucket."""

    rated: list[RatedRental]
    pieces: dict[str, list[Piece]]  # per rental, for re-rating at other plan terms
    runs: dict[str, dict[str, list[Span]]]
    stored_days: list[DaySeconds]  # the stored days' sums
    open_day: int  # the open day's index into ``day_bounds``
    live_pieces: dict[str, Sequence[Piece]]  # per rental, the open day's
    # The open day's idle spans per GPU, read when first needed: the what-if needs none.
    read_live_idle: Callable[[], Mapping[str, Sequence[Span]]]

    @cached_property
    def by_day(self) -> list[DaySeconds]:
        """The stored days' sums and the open day's."""
        live_idle = self.read_live_idle()
        out = list(self.stored_days)
        for rid, now_pieces in self.live_pieces.items():
            today: dict[Bucket, list[int]] = defaultdict(lambda: [0, 0])  # seconds, idle s
            for p in now_pieces:
                today[p.bucket][0] += p.seconds
                if p.bucket is Bucket.BILLABLE:
                    today[p.bucket][1] += overlap((p.start, p.end), live_idle.get(p.gpu_uuid, ()))
            out.extend(DaySeconds(rid, self.open_day, b, n, i) for b, (n, i) in today.items())
        return out

    @cached_property  # read once per rental by the usage API: summed once
    def idle_s(self) -> dict[str, int]:
        """Idle seconds to date per rental."""
        totals = {r.rental.rental_id: 0 for r in self.rated}
        for part in self.by_day:
            if part.rental_id in totals:
                totals[part.rental_id] += part.idle_s
        return totals

    def rerated(self, increment_s: int) -> list[RatedRental]:
        """The same pieces rated at another increment (the what-if)."""
        out = []
        for r in self.rated:
            plan = replace(r.rental.plan, increment_s=increment_s)
            rental = replace(r.rental, plan=plan)
            pieces, runs = self.pieces[rental.rental_id], self.runs[rental.rental_id]
            out.append(rate_pieces(rental, r.bounds, pieces, runs, r.period_s))
        return out


def parts(
    rated: Iterable[RatedRental], idle: Mapping[str, Sequence[Span]], cuts: Sequence[int]
) -> list[Part]:
    """Each rated piece cut at ``cuts`` (day bounds) and at its rental's price changes."""
    out: list[Part] = []
    for r in rated:
        points = r.rental.plan.price_points(r.rental.gpu_model)
        starts = [p.effective_from for p in points]
        bounds = sorted({*cuts, *starts})
        for piece in r.pieces:
            i = bisect_right(bounds, piece.start)
            edges = [piece.start, *bounds[i : bisect_left(bounds, piece.end)], piece.end]
            for lo, hi in pairwise(edges):
                price_from = starts[max(bisect_right(starts, lo) - 1, 0)]
                gpu_idle = idle.get(piece.gpu_uuid, ())
                idle_s = overlap((lo, hi), gpu_idle) if piece.bucket is Bucket.BILLABLE else 0
                out.append(
                    Part(
                        r.rental.rental_id, piece.gpu_uuid, lo, hi, piece.bucket, price_from, idle_s
                    )
                )
    return out


def _hash(*key: object) -> int:
    return int.from_bytes(hashlib.blake2b(repr(key).encode(), digest_size=8).digest(), "big")


class _Fingerprints:
    """Per-day sums (mod 2^64) of item hashes clipped to each day, in one pass over the items:
    a day an item covers whole gets the item's "whole" hash through a range sum."""

    def __init__(self, days: Sequence[int]) -> None:
        self.days = days  # bounds: n days, n + 1 entries
        self.sums = [0] * (len(days) - 1)
        self.whole = [0] * len(days)  # difference array of whole-day hashes

    def add(self, span: Span, *key: object) -> None:
        lo, hi = max(span[0], self.days[0]), min(span[1], self.days[-1])
        if lo >= hi:
            return
        days = self.days
        first, last = bisect_right(days, lo) - 1, bisect_left(days, hi) - 1  # hi - 1's day
        whole_from, whole_to = first + 1, last - 1  # the days strictly between are whole
        for i in {first, last}:
            a, b = max(lo, days[i]), min(hi, days[i + 1])
            if (a, b) == (days[i], days[i + 1]):
                whole_from, whole_to = min(whole_from, i), max(whole_to, i)
            else:
                self.sums[i] = (self.sums[i] + _hash(*key, a, b)) & _MASK
        if whole_from <= whole_to:
            h = _hash(*key, "whole")
            self.whole[whole_from] = (self.whole[whole_from] + h) & _MASK
            self.whole[whole_to + 1] = (self.whole[whole_to + 1] - h) & _MASK

    def result(self) -> list[int]:
        running, out = 0, []
        for i, partial in enumerate(self.sums):
            running = (running + self.whole[i]) & _MASK
            value = (running + partial) & _MASK
            out.append(value - (1 << 64) if value >= 1 << 63 else value)  # a signed BIGINT
        return out


def fingerprints(inputs: PeriodInputs, customer_id: uuid.UUID, days: Sequence[int]) -> list[int]:
    """One fingerprint per day of ``days`` (bounds) over everything rating reads for it."""
    f = _Fingerprints(days)
    whole = (days[0], days[-1])
    for rental in inputs.rentals(customer_id):
        f.add(whole, "rental", repr(rental))
    for a in inputs.assignments_of(customer_id):
        f.add((a.start, a.end), "assignment", a.rental_id, a.gpu_uuid)
    for m in inputs.migrations_of(customer_id):
        f.add((m.failed_at, m.resumed_at), "migration", m.rental_id, m.from_gpu, m.to_gpu)
    for gpu, segments in inputs.segments_by_gpu.items():
        for s in segments:
            f.add((s.start, s.end), "segment", gpu, s.state.value)
    for gpu, windows in inputs.maintenance_by_gpu.items():
        for w in windows:
            f.add(w, "maintenance", gpu)
    return f.result()


def _ended(days: Sequence[int], as_of: int) -> int:
    """How many of the days (bounds) have ended by ``as_of``."""
    return max(bisect_right(days, as_of) - 1, 0)


# Reads each GPU's idle spans over a span (``usage.idle_by_gpu`` with its session).
IdleReader = Callable[[Sequence[str], Span], Mapping[str, Sequence[Span]]]


def rated_to_date(
    session: Session,
    customer_id: uuid.UUID,
    period: BillingPeriod,
    as_of: int,
    inputs: PeriodInputs,
    read_idle: IdleReader,
) -> ToDate:
    """The customer's rentals rated over [period start, ``as_of``) from ``inputs`` (loaded for
    that span): stored closed days (re-rated first where stale) plus the open day rated live."""
    days = store_closed_days(session, customer_id, period, as_of, inputs, read_idle)
    closed = len(days) - 1
    open_start = days[closed] if closed else period.span[0]
    rentals = inputs.rentals(customer_id)
    stored = _stored_pieces(session, customer_id, rentals, inputs, period, open_start)
    live = _rate(inputs, customer_id, (open_start, as_of), period) if open_start < as_of else []
    live_of = {r.rental.rental_id: r for r in live}
    stored_days = repository.rollup_day_seconds(session, customer_id, days) if closed else []

    def read_live_idle() -> Mapping[str, Sequence[Span]]:
        return read_idle(inputs.gpus, (open_start, as_of)) if open_start < as_of else {}

    out = ToDate(
        rated=[],
        pieces={},
        runs={},
        stored_days=[DaySeconds(str(r), d, Bucket(b), s, i) for r, d, b, s, i in stored_days],
        open_day=closed,
        live_pieces={},
        read_live_idle=read_live_idle,
    )
    for rental in rentals:
        rid = rental.rental_id
        bounds = rental_bounds(rental, (period.span[0], as_of))
        mine = [a for a in inputs.assignments_of(customer_id) if a.rental_id == rid]
        runs = session_runs(mine, bounds)
        now_pieces = live_of[rid].pieces if rid in live_of else ()
        pieces = sorted([*stored.get(rid, ()), *now_pieces], key=lambda p: (p.gpu_uuid, p.start))
        period_s = period.span[1] - period.span[0]
        out.rated.append(rate_pieces(rental, bounds, pieces, runs, period_s))
        out.pieces[rid], out.runs[rid], out.live_pieces[rid] = pieces, runs, now_pieces
    return out


def store_closed_days(
    session: Session,
    customer_id: uuid.UUID,
    period: BillingPeriod,
    as_of: int,
    inputs: PeriodInputs,
    read_idle: IdleReader,
) -> list[int]:
    """Rate and store the period's days closed by ``as_of`` whose rollups are missing or stale
    (what the first read after a day closes would do); the closed days' bounds."""
    days = [d for d in day_bounds(period) if d <= as_of]
    days = days[: _ended(days, as_of) + 1]
    if len(days) > 1:
        _refresh_stale(session, customer_id, period, inputs, days, read_idle)
    return days


def _rate(
    inputs: PeriodInputs, customer_id: uuid.UUID, span: Span, period: BillingPeriod
) -> list[RatedRental]:
    return rate_rentals(
        inputs.rentals(customer_id),
        inputs.assignments_of(customer_id),
        inputs.segments_by_gpu,
        inputs.maintenance_by_gpu,
        inputs.migrations_of(customer_id),
        span,
        period.span,
    )


def _refresh_stale(
    session: Session,
    customer_id: uuid.UUID,
    period: BillingPeriod,
    inputs: PeriodInputs,
    days: Sequence[int],
    read_idle: IdleReader,
) -> None:
    wanted = fingerprints(inputs, customer_id, days)
    stored = repository.rollup_fingerprints(session, customer_id, days[0], days[-1])
    stale = [i for i, fp in enumerate(wanted) if stored.get(days[i]) != fp]
    if not stale:
        return
    repository.lock_rollups(session, customer_id)
    lo, hi = days[stale[0]], days[stale[-1] + 1]
    # Rated from the period's start: sessions (and so nothing else) cross day bounds.
    rated = _rate(inputs, customer_id, (period.span[0], hi), period)
    idle = read_idle(inputs.gpus, (lo, hi))
    stale_days = {days[i] for i in stale}
    kept = [  # parts never cross a day bound: a part is in the day its start is in
        p for p in parts(rated, idle, days) if days[bisect_right(days, p.start) - 1] in stale_days
    ]
    repository.replace_rollups(
        session,
        customer_id,
        [(days[i], days[i + 1]) for i in stale],
        [
            {
                "customer_id": customer_id,
                "rental_id": uuid.UUID(p.rental_id),
                "gpu_uuid": p.gpu_uuid,
                "start": p.start,
                "end": p.end,
                "bucket": p.bucket.value,
                "price_from": p.price_from,
                "idle_s": p.idle_s,
            }
            for p in kept
        ],
        {days[i]: wanted[i] for i in stale},
    )


def _stored_pieces(
    session: Session,
    customer_id: uuid.UUID,
    rentals: Sequence[RentalInput],
    inputs: PeriodInputs,
    period: BillingPeriod,
    end: int,
) -> dict[str, list[Piece]]:
    """The stored days' pieces per rental: one summed piece per (GPU, bucket, price point)
    where the GPU has one session in the period, downtime and other GPUs' pieces as stored."""
    pieces: dict[str, list[Piece]] = defaultdict(list)
    if end <= period.span[0]:
        return pieces
    several = _gpus_with_several_runs(rentals, inputs, customer_id, (period.span[0], end))
    stored = repository.rollup_pieces(
        session, customer_id, period.span[0], end, [b.value for b in DOWNTIME], several
    )
    for rid, gpu, bucket, seconds, last_end in stored:
        pieces[str(rid)].append(Piece(gpu, last_end - seconds, last_end, Bucket(bucket), None))
    return pieces


def _gpus_with_several_runs(
    rentals: Sequence[RentalInput], inputs: PeriodInputs, customer_id: uuid.UUID, span: Span
) -> list[str]:
    several: set[str] = set()
    assignments = inputs.assignments_of(customer_id)
    for rental in rentals:
        bounds = rental_bounds(rental, span)
        mine = [a for a in assignments if a.rental_id == rental.rental_id]
        several |= {gpu for gpu, runs in session_runs(mine, bounds).items() if len(runs) > 1}
    return sorted(several)
