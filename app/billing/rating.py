"""Rating: rented GPU-seconds -> buckets -> sessions -> invoice lines, by interval algebra.

API:
    rate_rental(rental, assignments, segments_by_gpu, maintenance_by_gpu, migrations, period)
        -> RatedRental
    rate_rentals(rentals, assignments, segments_by_gpu, maintenance_by_gpu, migrations, period)
        -> list[RatedRental]        # builds each GPU's health timeline once for all rentals
    build_timeline(segments, maintenance) -> Timeline
    price_at(rental, time) -> Decimal
    cap(rental) -> Decimal | None
    is_billed(bucket, plan) -> bool

Rules (where the design left room):
* Bounds: everything is clipped to ``period`` intersected with [rental_start, rental_end).
* Rented GPU-seconds of a rental = for each GPU, the union of its assignments on that GPU
  minus the migration windows involving that GPU (as ``from_gpu`` or ``to_gpu``), plus each
  migration window counted once, attributed to ``from_gpu``. So a window is rented whether
  the old assignment's tail, the new one's head, both, or neither (a gap) covers it, and is
  never counted twice. Windows from the same GPU that overlap or touch are merged; the merged
  window carries the earliest migration's evidence.
* Buckets, by precedence: migration window > maintenance > failed > no segment (unmetered)
  > degraded (``degraded`` or ``degraded_credit`` per ``bill_degraded``) > healthy (billable).
  Overlapping segments of one GPU resolve to the worst state (failed > degraded > healthy).
  Buckets always sum to rented seconds; increment rounding is not a bucket.
* Billed buckets: billable, degraded, and unmetered when ``bill_unmetered``.
* A session is a maximal run of the union of one rental's assignments on one GPU, clipped to
  the bounds (so adjacent or overlapping assignments form one session). Its billed seconds
  are rounded up to ``increment_s`` and then raised to ``minimum_s``, only if > 0; a session
  with no billed seconds costs nothing. The extra seconds are charged at the price in effect
  at the session's last billed second.
* Charge lines: one per price period with any charged seconds; seconds = rounded billed
  seconds + all credit-bucket seconds in that price period.
* Credit lines: one per credit piece (a maximal run of one credit bucket on one GPU: a
  failure incident, a migration window, a degraded run), split at price changes so each
  credit mirrors exactly the charge it reverses. Evidence = first segment's / migration's.
* Cap line: when charges + credits exceed ``monthly_cap_per_gpu x gpu_count`` (rounded to
  the currency, not prorated for partial periods) a negative line brings the net to the cap.
"""

from bisect import bisect_right
from collections import defaultdict
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any, NamedTuple

from app.billing.domain import (
    CREDIT_BUCKETS,
    Assignment,
    Bucket,
    GpuState,
    Migration,
    Piece,
    PlanTerms,
    PricePoint,
    RentalInput,
    Segment,
    Session,
)
from app.billing.intervals import Span, clip, merge, subtract
from app.billing.lines import InvoiceLine, cap_line, charge_line, credit_line, sum_amounts
from app.core.money import round_money
from metering_agent.protocol import SEVERITY


class _Cell(NamedTuple):
    """A maximal interval with one worst active segment and one maintenance flag."""

    start: int
    end: int
    segment: Segment | None  # the worst active segment (the first one of a fused run)
    maintenance: bool


class Timeline:
    """One GPU's disjoint, sorted health cells; gaps between cells have no telemetry."""

    def __init__(self, cells: list[_Cell]) -> None:
        self._cells = cells
        self._starts = [cell.start for cell in cells]

    def cells_in(self, start: int, end: int) -> Iterator[_Cell]:
        """Cells covering [start, end), clipped, with synthetic empty cells for the gaps."""
        i = max(bisect_right(self._starts, start) - 1, 0)
        if i < len(self._cells) and self._cells[i].end <= start:
            i += 1
        cursor = start
        while cursor < end:
            if i < len(self._cells) and self._cells[i].start <= cursor:
                cell = self._cells[i]
                stop = min(cell.end, end)
                yield _Cell(cursor, stop, cell.segment, cell.maintenance)
                i += 1
            else:
                stop = min(self._starts[i], end) if i < len(self._cells) else end
                yield _Cell(cursor, stop, None, False)
            cursor = stop


def build_timeline(segments: Iterable[Segment], maintenance: Iterable[Span]) -> Timeline:
    """Sweep-line over segment and maintenance boundaries: O(n log n)."""
    nonempty = [s for s in segments if s.start < s.end]
    events = [(s.start, 1, i) for i, s in enumerate(nonempty)]
    events += [(s.end, -1, i) for i, s in enumerate(nonempty)]
    items: list[Segment | None] = list(nonempty)
    for start, end in merge(maintenance):
        items.append(None)
        events += [(start, 1, len(items) - 1), (end, -1, len(items) - 1)]
    events.sort()
    active: dict[int, Segment | None] = {}
    cells: list[_Cell] = []
    for k, (time, delta, index) in enumerate(events):
        if delta > 0:
            active[index] = items[index]
        else:
            del active[index]
        # Emit a cell only once every event at ``time`` has been applied.
        next_time = events[k + 1][0] if k + 1 < len(events) else time
        if next_time > time and active:
            _extend(cells, _cell(time, next_time, active.values()))
    return Timeline(cells)


def _cell(start: int, end: int, active: Collection[Segment | None]) -> _Cell:
    if len(active) == 1:  # the common case: one segment, no overlap
        [only] = active
        return _Cell(start, end, only, only is None)
    segments = [s for s in active if s is not None]
    worst = max(segments, key=lambda s: SEVERITY[s.state], default=None)
    return _Cell(start, end, worst, len(segments) < len(active))


def _extend(cells: list[_Cell], cell: _Cell) -> None:
    """Fuse a cell into the previous one when nothing billing-relevant changes.

    Keeping the first segment is what piece fusion would do anyway, so results are identical.
    """
    last = cells[-1] if cells else None
    if (
        last is not None
        and last.end == cell.start
        and last.maintenance == cell.maintenance
        and (last.segment and last.segment.state) == (cell.segment and cell.segment.state)
    ):
        cells[-1] = last._replace(end=cell.end)
    else:
        cells.append(cell)


def _bucket(cell: _Cell, plan: PlanTerms) -> Bucket:
    if cell.maintenance:
        return Bucket.MAINTENANCE
    if cell.segment is None:
        return Bucket.UNMETERED
    if cell.segment.state is GpuState.FAILED:
        return Bucket.FAILURE_CREDIT
    if cell.segment.state is GpuState.DEGRADED:
        return Bucket.DEGRADED if plan.bill_degraded else Bucket.DEGRADED_CREDIT
    return Bucket.BILLABLE


def is_billed(bucket: Bucket, plan: PlanTerms) -> bool:
    if bucket is Bucket.UNMETERED:
        return plan.bill_unmetered
    return bucket in (Bucket.BILLABLE, Bucket.DEGRADED)


class _PriceBook:
    """The plan's price points for one GPU model, searchable by time."""

    def __init__(self, points: Sequence[PricePoint]) -> None:
        self.points = points
        self._starts = [p.effective_from for p in points]

    def index_at(self, time: int) -> int:
        i = bisect_right(self._starts, time) - 1
        if i < 0:
            raise ValueError(f"no price in effect at {time}")
        return i

    def price(self, index: int) -> Decimal:
        return self.points[index].price_per_hour

    def period_of(self, index: int, bounds: Span) -> Span:
        end = self._starts[index + 1] if index + 1 < len(self._starts) else bounds[1]
        return max(self._starts[index], bounds[0]), min(end, bounds[1])

    def split(self, start: int, end: int) -> Iterator[tuple[int, Span]]:
        """(price index, sub-span) for [start, end) cut at every price change inside it."""
        index, cursor = self.index_at(start), start
        while cursor < end:
            stop = min(self.period_of(index, (cursor, end))[1], end)
            yield index, (cursor, stop)
            index, cursor = index + 1, stop


@dataclass(frozen=True)
class RatedRental:
    rental: RentalInput
    bounds: Span
    pieces: tuple[Piece, ...]
    sessions: tuple[Session, ...]
    lines: tuple[InvoiceLine, ...]
    buckets: Mapping[Bucket, int] = field(hash=False)

    @property
    def rented_s(self) -> int:
        return sum(self.buckets.values())

    @property
    def billed_s(self) -> int:
        """Billed seconds after increments and minimums."""
        return sum(s.charged_s for s in self.sessions)

    @property
    def credited_s(self) -> int:
        return sum(self.buckets[b] for b in CREDIT_BUCKETS)

    @property
    def net(self) -> Decimal:
        """Charges + credits + cap: what this rental costs before vouchers and tax."""
        return sum_amounts(self.lines, self.rental.plan.currency)


def rate_rental(
    rental: RentalInput,
    assignments: Iterable[Assignment],
    segments_by_gpu: Mapping[str, Sequence[Segment]],
    maintenance_by_gpu: Mapping[str, Sequence[Span]],
    migrations: Iterable[Migration],
    period: Span,
) -> RatedRental:
    [rated] = rate_rentals(
        [rental], assignments, segments_by_gpu, maintenance_by_gpu, migrations, period
    )
    return rated


def rate_rentals(
    rentals: Iterable[RentalInput],
    assignments: Iterable[Assignment],
    segments_by_gpu: Mapping[str, Sequence[Segment]],
    maintenance_by_gpu: Mapping[str, Sequence[Span]],
    migrations: Iterable[Migration],
    period: Span,
) -> list[RatedRental]:
    assignments_of: dict[str, list[Assignment]] = defaultdict(list)
    for assignment in assignments:
        assignments_of[assignment.rental_id].append(assignment)
    migrations_of: dict[str, list[Migration]] = defaultdict(list)
    for migration in migrations:
        migrations_of[migration.rental_id].append(migration)
    rentals = list(rentals)
    gpus = {a.gpu_uuid for r in rentals for a in assignments_of[r.rental_id]}
    timelines = {
        gpu: build_timeline(segments_by_gpu.get(gpu, ()), maintenance_by_gpu.get(gpu, ()))
        for gpu in gpus
    }
    return [
        _rate(r, assignments_of[r.rental_id], migrations_of[r.rental_id], timelines, period)
        for r in rentals
    ]


def price_at(rental: RentalInput, time: int) -> Decimal:
    """The rental's price per GPU-hour in effect at ``time``."""
    book = _PriceBook(rental.plan.price_points(rental.gpu_model))
    return book.price(book.index_at(time))


def _bounds(rental: RentalInput, period: Span) -> Span:
    start = max(rental.rental_start, period[0])
    return start, max(start, rental.end_by(period[1]))


def _rate(
    rental: RentalInput,
    assignments: Sequence[Assignment],
    migrations: Sequence[Migration],
    timelines: Mapping[str, Timeline],
    period: Span,
) -> RatedRental:
    bounds = _bounds(rental, period)
    window_pieces = _window_pieces(migrations, bounds)
    holes: dict[str, list[Span]] = defaultdict(list)
    for m in migrations:
        holes[m.from_gpu].append((m.failed_at, m.resumed_at))
        holes[m.to_gpu].append((m.failed_at, m.resumed_at))
    pieces: list[Piece] = []
    sessions: list[Session] = []
    for gpu in sorted({a.gpu_uuid for a in assignments}):
        spans = [(a.start, a.end) for a in assignments if a.gpu_uuid == gpu]
        for run in merge(c for span in spans if (c := clip(span, bounds))):
            session_pieces = _classify(gpu, run, holes[gpu], timelines[gpu], rental.plan)
            sessions.append(_session(gpu, run, session_pieces, rental.plan))
            pieces += session_pieces
    pieces = sorted(pieces + window_pieces, key=lambda p: (p.gpu_uuid, p.start))
    buckets = {b: 0 for b in Bucket}
    for piece in pieces:
        buckets[piece.bucket] += piece.seconds
    lines = _lines(rental, bounds, pieces, sessions)
    return RatedRental(rental, bounds, tuple(pieces), tuple(sessions), lines, buckets)


def _window_pieces(migrations: Sequence[Migration], bounds: Span) -> list[Piece]:
    by_gpu: dict[str, list[tuple[Span, Migration]]] = defaultdict(list)
    for m in migrations:
        if window := clip((m.failed_at, m.resumed_at), bounds):
            by_gpu[m.from_gpu].append((window, m))
    pieces: list[Piece] = []
    for gpu, windows in by_gpu.items():
        windows.sort(key=lambda w: w[0])
        for window in merge(span for span, _ in windows):
            first = next(m for span, m in windows if span[0] >= window[0])
            pieces.append(Piece(gpu, *window, Bucket.MIGRATION_CREDIT, None, first.evidence))
    return pieces


def _classify(
    gpu: str, run: Span, holes: Sequence[Span], timeline: Timeline, plan: PlanTerms
) -> list[Piece]:
    runs: list[list[Any]] = []  # [start, end, bucket, evidence], fused while adjacent and equal
    for start, end in subtract([run], holes):
        for cell in timeline.cells_in(start, end):
            bucket = _bucket(cell, plan)
            if runs and runs[-1][1] == cell.start and runs[-1][2] is bucket:
                runs[-1][1] = cell.end
                continue
            evidence = cell.segment.evidence if cell.segment and bucket in CREDIT_BUCKETS else None
            runs.append([cell.start, cell.end, bucket, evidence])
    return [Piece(gpu, start, end, bucket, run[0], ev) for start, end, bucket, ev in runs]


def _session(gpu: str, run: Span, pieces: Sequence[Piece], plan: PlanTerms) -> Session:
    billed = [p for p in pieces if is_billed(p.bucket, plan)]
    billed_s = sum(p.seconds for p in billed)
    charged_s = 0
    if billed_s > 0:
        charged_s = max(-(-billed_s // plan.increment_s) * plan.increment_s, plan.minimum_s)
    last = billed[-1].end - 1 if billed else None
    return Session(gpu, run[0], run[1], billed_s, charged_s, last)


def _lines(
    rental: RentalInput, bounds: Span, pieces: Sequence[Piece], sessions: Sequence[Session]
) -> tuple[InvoiceLine, ...]:
    plan, model, rental_id = rental.plan, rental.gpu_model, rental.rental_id
    book = _PriceBook(plan.price_points(model))
    charged: dict[int, int] = defaultdict(int)
    credits: list[InvoiceLine] = []
    for piece in pieces:
        credited = piece.bucket in CREDIT_BUCKETS
        if not (credited or is_billed(piece.bucket, plan)):
            continue
        for index, (start, end) in book.split(piece.start, piece.end):
            charged[index] += end - start
            if credited:
                part = replace(piece, start=start, end=end)
                credits.append(
                    credit_line(rental_id, model, part, book.price(index), plan.currency)
                )
    for session in sessions:
        if session.last_billed_at is not None:
            charged[book.index_at(session.last_billed_at)] += session.extra_s
    lines = [
        charge_line(rental_id, model, book.period_of(i, bounds), s, book.price(i), plan.currency)
        for i, s in sorted(charged.items())
    ]
    lines += credits
    capped = cap_line(rental_id, sum_amounts(lines, plan.currency), cap(rental), plan.currency)
    if capped:
        lines.append(capped)
    return tuple(lines)


def cap(rental: RentalInput) -> Decimal | None:
    """The rental's monthly ceiling (all its GPUs), rounded to the currency; None: no cap."""
    cap_per_gpu = rental.plan.monthly_cap_per_gpu
    if cap_per_gpu is None:
        return None
    return round_money(cap_per_gpu * rental.gpu_count, rental.plan.currency)
