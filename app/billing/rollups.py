"""Stored rollups of rated usage: closed days and the open day up to its last closed hour are
read from storage, the rest of the open day (at most an hour and ``HOUR_GRACE_S``) is rated
live.

A stored span is a closed local day, or the open span: the open day from its local midnight
to its last closed hour, one span that grows by an hour each hour and that the day replaces
when it closes. It holds rating's own output: the pieces ``classify_rentals`` gives for the
span, cut at the span's bounds and at price changes, each stored with its bucket, the price
point in effect and its idle seconds (billable seconds in minutes below the idle threshold,
as ``effective_usage`` counts them). Pieces are time-local (a second's bucket depends only on
that second's inputs), so the parts of a span rated alone equal the parts of the same span in
any longer rating. A read adds the live pieces (classified from the end of what is stored)
and hands all of them to ``rating.rate_pieces``, which forms sessions (increments, minimums),
charge, credit and cap lines by the same code as the invoice: no second formula. Each
(rental, GPU, bucket, price point) of the stored spans comes back as one summed piece placed
at the end of its parts (so it stays in its price period and session, and its last second is
the last billed one); downtime pieces (failure and migration credits) come back as stored,
for the what-if's incidents. Credit lines of such a rating keep the invoice's totals, not its
per-incident split; the invoice itself always rates from the raw inputs.

Freshness: each stored span keeps its end and a fingerprint of its inputs clipped to it:
segments (so late telemetry that creates or changes a segment touching a stored span; a
segment merely extended past the span leaves its fingerprint alone), assignments, migrations,
maintenance and each rental's terms and plan. A read computes the fingerprints from the inputs
it loads anyway (one pass, with range sums for the spans an item covers whole) and re-rates
the stale or missing spans first. The open span takes in an hour only ``HOUR_GRACE_S`` after
the hour ends, so the minute metrics of its last minutes are in; as it is rated again from
midnight each hour, and the day again once it closes, minute metrics that come late within
the day are taken in too. Not covered: minute metrics for a closed day that come after it was
stored, without a segment change (idle seconds stay as first stored; agents send both
together).

API:
    day_bounds(period) -> [int]          # local midnights in the period, then its end
    rated_to_date(session, customer_id, period, as_of, inputs, read_idle) -> ToDate
    store_closed(session, customer_id, period, as_of, inputs, read_idle) -> Stored
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
from itertools import groupby, pairwise
from zoneinfo import ZoneInfo

from sqlalchemy.orm import Session

from app.billing import repository
from app.billing.core.domain import DOWNTIME_BUCKETS, Bucket, Piece, RentalInput
from app.billing.core.effective import overlap
from app.billing.core.intervals import Span
from app.billing.core.rating import (
    RatedRental,
    by_rental,
    classify_rentals,
    rate_pieces,
    rental_bounds,
    session_runs,
)
from app.billing.loader import BillingPeriod, PeriodInputs
from app.core.epoch import epoch, from_epoch

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
    """The period to date rated from rollups and the live rest of the open day, with each
    rental's seconds per day and bucket."""

    rated: list[RatedRental]
    pieces: dict[str, list[Piece]]  # per rental, for re-rating at other plan terms
    runs: dict[str, dict[str, list[Span]]]
    stored_days: list[DaySeconds]  # the stored spans' sums (the open span's as its day's)
    open_day: int  # the open day's index into ``day_bounds``
    live_pieces: dict[str, Sequence[Piece]]  # per rental, those rated live (after the stored)
    # The live span's idle spans per GPU, read when first needed: the what-if needs none.
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
    rentals: Iterable[RentalInput],
    pieces: Mapping[str, Sequence[Piece]],
    idle: Mapping[str, Sequence[Span]],
    cuts: Sequence[int],
) -> list[Part]:
    """Each rental's ``pieces`` cut at ``cuts`` (span bounds) and at its price changes."""
    out: list[Part] = []
    for rental in rentals:
        points = rental.plan.price_points(rental.gpu_model)
        starts = [p.effective_from for p in points]
        bounds = sorted({*cuts, *starts})
        for piece in pieces.get(rental.rental_id, ()):
            i = bisect_right(bounds, piece.start)
            edges = [piece.start, *bounds[i : bisect_left(bounds, piece.end)], piece.end]
            for lo, hi in pairwise(edges):
                price_from = starts[max(bisect_right(starts, lo) - 1, 0)]
                gpu_idle = idle.get(piece.gpu_uuid, ())
                idle_s = overlap((lo, hi), gpu_idle) if piece.bucket is Bucket.BILLABLE else 0
                out.append(
                    Part(
                        rental.rental_id,
                        piece.gpu_uuid,
                        lo,
                        hi,
                        piece.bucket,
                        price_from,
                        idle_s,
                    )
                )
    return out


def _hash(key: tuple[object, ...]) -> int:
    return int.from_bytes(hashlib.blake2b(repr(key).encode(), digest_size=8).digest(), "big")


def _clipped(key_hash: int, lo: int, hi: int) -> int:
    """The hash of an item clipped to [lo, hi): its key's hash mixed with the bounds
    (splitmix64's finalizer), so an item costs one cryptographic hash however it is cut."""
    x = (key_hash ^ (lo * 0x9E3779B97F4A7C15) ^ (hi * 0xC2B2AE3D27D4EB4F)) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


class _Fingerprints:
    """Per-span sums (mod 2^64) of item hashes clipped to each span, in one pass over the
    items: a span an item covers whole gets the item's key hash through a range sum."""

    def __init__(self, days: Sequence[int]) -> None:
        self.days = days  # bounds: n spans, n + 1 entries
        self.sums = [0] * (len(days) - 1)
        self.whole = [0] * len(days)  # difference array of whole-span hashes

    def add(self, span: Span, *key: object) -> None:
        days = self.days
        lo, hi = max(span[0], days[0]), min(span[1], days[-1])
        if lo >= hi:
            return
        h = _hash(key)
        first, last = bisect_right(days, lo) - 1, bisect_left(days, hi) - 1  # hi - 1's span
        if first == last and not (lo == days[first] and hi == days[first + 1]):
            self._add_clipped(first, h, lo, hi)
            return
        whole_from, whole_to = first, last
        if lo != days[first]:
            self._add_clipped(first, h, lo, days[first + 1])
            whole_from += 1
        if hi != days[last + 1]:
            self._add_clipped(last, h, days[last], hi)
            whole_to -= 1
        if whole_from <= whole_to:
            self.whole[whole_from] = (self.whole[whole_from] + h) & _MASK
            self.whole[whole_to + 1] = (self.whole[whole_to + 1] - h) & _MASK

    def _add_clipped(self, i: int, key_hash: int, lo: int, hi: int) -> None:
        self.sums[i] = (self.sums[i] + _clipped(key_hash, lo, hi)) & _MASK

    def result(self) -> list[int]:
        running, out = 0, []
        for i, partial in enumerate(self.sums):
            running = (running + self.whole[i]) & _MASK
            value = (running + partial) & _MASK
            out.append(value - (1 << 64) if value >= 1 << 63 else value)  # a signed BIGINT
        return out


def fingerprints(inputs: PeriodInputs, customer_id: uuid.UUID, days: Sequence[int]) -> list[int]:
    """One fingerprint per span of ``days`` (bounds) over everything rating reads for it."""
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


# Reads each GPU's idle spans over a span (``usage.idle_by_gpu`` with its session).
IdleReader = Callable[[Sequence[str], Span], Mapping[str, Sequence[Span]]]

HOUR = 3600
# An hour of the open day is stored this long after it ends: agents upload every few seconds,
# so its last minute metrics are in by then, and the hourly job (at :07) finds it due.
HOUR_GRACE_S = 300


@dataclass(frozen=True)
class Stored:
    """The spans stored by a moment: the closed local days, then the open day up to its last
    closed hour."""

    days: list[int]  # the closed days' bounds; the last one is the open day's start
    end: int  # where the stored spans end and live rating starts

    @property
    def bounds(self) -> list[int]:
        """The stored spans' bounds: ``days``, then the open span's end, if it has begun."""
        return self.days if self.end == self.days[-1] else [*self.days, self.end]


def stored_spans(period: BillingPeriod, as_of: int) -> Stored:
    """The spans of ``period`` to store by ``as_of``: its days closed by then, and the open
    day from its local midnight to the last hour (counted from that midnight) that ended
    ``HOUR_GRACE_S`` before ``as_of``."""
    days = [d for d in day_bounds(period) if d <= as_of] or [period.span[0]]
    closed_hours = max(as_of - HOUR_GRACE_S - days[-1], 0) // HOUR
    return Stored(days, days[-1] + closed_hours * HOUR)


def rated_to_date(
    session: Session,
    customer_id: uuid.UUID,
    period: BillingPeriod,
    as_of: int,
    inputs: PeriodInputs,
    read_idle: IdleReader,
) -> ToDate:
    """The customer's rentals rated over [period start, ``as_of``) from ``inputs`` (loaded for
    that span): the stored spans (re-rated first where stale), then the rest rated live."""
    stored = store_closed(session, customer_id, period, as_of, inputs, read_idle)
    live_span = (stored.end, as_of)
    assignments_of = by_rental(inputs.assignments_of(customer_id))
    runs_of: dict[str, dict[str, list[Span]]] = {}
    bounds_of: dict[str, Span] = {}
    for rental in inputs.rentals(customer_id):
        rid = rental.rental_id
        bounds_of[rid] = rental_bounds(rental, (period.span[0], as_of))
        runs_of[rid] = session_runs(assignments_of[rid], bounds_of[rid])
    stored_pieces, stored_days = _stored(session, customer_id, stored.bounds, runs_of)
    live = _classify(inputs, customer_id, live_span) if stored.end < as_of else {}

    def read_live_idle() -> Mapping[str, Sequence[Span]]:
        return read_idle(inputs.gpus, live_span) if stored.end < as_of else {}

    out = ToDate(
        rated=[],
        pieces={},
        runs=runs_of,
        stored_days=stored_days,
        open_day=len(stored.days) - 1,
        live_pieces={},
        read_live_idle=read_live_idle,
    )
    period_s = period.span[1] - period.span[0]
    for rental in inputs.rentals(customer_id):
        rid = rental.rental_id
        now_pieces = live.get(rid, [])
        pieces = sorted(
            [*stored_pieces.get(rid, ()), *now_pieces], key=lambda p: (p.gpu_uuid, p.start)
        )
        out.rated.append(rate_pieces(rental, bounds_of[rid], pieces, runs_of[rid], period_s))
        out.pieces[rid], out.live_pieces[rid] = pieces, now_pieces
    return out


def store_closed(
    session: Session,
    customer_id: uuid.UUID,
    period: BillingPeriod,
    as_of: int,
    inputs: PeriodInputs,
    read_idle: IdleReader,
) -> Stored:
    """Rate and store the period's spans closed by ``as_of`` (``stored_spans``) whose rollups
    are missing or stale: what the first read after they close would do."""
    stored = stored_spans(period, as_of)
    if len(stored.bounds) > 1:
        _refresh_stale(session, customer_id, inputs, stored.bounds, read_idle)
    return stored


def _classify(inputs: PeriodInputs, customer_id: uuid.UUID, span: Span) -> dict[str, list[Piece]]:
    classified = classify_rentals(inputs.for_customer(customer_id, span))
    return {c.rental.rental_id: c.pieces for c in classified}


def _refresh_stale(
    session: Session,
    customer_id: uuid.UUID,
    inputs: PeriodInputs,
    bounds: Sequence[int],
    read_idle: IdleReader,
) -> None:
    wanted = fingerprints(inputs, customer_id, bounds)
    spans = list(pairwise(bounds))

    def stale_spans() -> list[int]:
        have = repository.rollup_fingerprints(session, customer_id, bounds[0], bounds[-1])
        return [i for i, (lo, hi) in enumerate(spans) if have.get(lo) != (hi, wanted[i])]

    if not stale_spans():
        return
    repository.lock_rollups(session, customer_id)
    # Looked at again under the lock: readers that queued behind the one storing a span that
    # just closed find it stored, instead of each rating it again in turn.
    if not (stale := stale_spans()):
        return
    rentals, rows = inputs.rentals(customer_id), []
    # Each run of adjacent stale spans is rated on its own (pieces are time-local), so the
    # open span's new hour costs the open day's rating, not the period's.
    for _, run in groupby(enumerate(stale), key=lambda k: k[1] - k[0]):
        indexes = [i for _, i in run]
        span = (bounds[indexes[0]], bounds[indexes[-1] + 1])
        pieces = _classify(inputs, customer_id, span)
        idle = read_idle(inputs.gpus, span)
        rows += [_row(customer_id, p) for p in parts(rentals, pieces, idle, bounds)]
    repository.replace_rollups(session, customer_id, {spans[i]: wanted[i] for i in stale}, rows)


def _row(customer_id: uuid.UUID, part: Part) -> dict[str, object]:
    return {
        "customer_id": customer_id,
        "rental_id": uuid.UUID(part.rental_id),
        "gpu_uuid": part.gpu_uuid,
        "start": part.start,
        "end": part.end,
        "bucket": part.bucket.value,
        "price_from": part.price_from,
        "idle_s": part.idle_s,
    }


def _stored(
    session: Session,
    customer_id: uuid.UUID,
    bounds: Sequence[int],
    runs_of: Mapping[str, Mapping[str, Sequence[Span]]],
) -> tuple[dict[str, list[Piece]], list[DaySeconds]]:
    """The stored spans' pieces per rental, one summed piece per (GPU, bucket, price point)
    where the GPU has one session to date (``runs_of``: per rental, each GPU's), downtime and
    other GPUs' pieces as stored; and their seconds per (rental, day, bucket)."""
    several = sorted({gpu for runs in runs_of.values() for gpu, r in runs.items() if len(r) > 1})
    stored = repository.stored_rollups(
        session, customer_id, bounds, [b.value for b in DOWNTIME_BUCKETS], several
    )
    pieces: dict[str, list[Piece]] = defaultdict(list)
    for rid, gpu, bucket, seconds, last_end in stored.pieces:
        pieces[str(rid)].append(Piece(gpu, last_end - seconds, last_end, Bucket(bucket), None))
    days = [DaySeconds(str(r), d, Bucket(b), n, i) for r, d, b, n, i in stored.span_seconds]
    return pieces, days
