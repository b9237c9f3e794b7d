"""Rating: rented GPU-seconds -> buckets -> sessions -> invoice lines, by interval algebra.

API:
    rate_rental(inputs, cap_period=None) -> RatedRental   # inputs of one rental
    rate_rentals(inputs, cap_period=None) -> list[RatedRental]   # each GPU's timeline built once
    classify_rentals(inputs) -> [Classified]   # the pieces alone
    rate_pieces(rental, bounds, pieces, runs, period_s) -> RatedRental   # from stored pieces
    rental_bounds(rental, period) -> Span
    session_runs(assignments, bounds) -> {gpu: [Span]}
    cap_allowance(rated, buckets) -> Decimal | None
    build_timeline(segments, maintenance) -> Timeline
    price_at(rental, time) -> Decimal
    is_billed(bucket, plan) -> bool

Rules (where the design left room):
* Bounds: everything is clipped to ``inputs.period`` intersected with [rental_start, rental_end).
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
* Stall (``credit_stall``, on by default): a failure stalls the whole job, so while any GPU of
  the rental is failed or in a migration window (from the failure second until the job runs
  again on a spare, the GPU is repaired, or the rental ends), the rental's other GPUs'
  billable and degraded seconds are ``stall_credit``, with the stalling piece's evidence.
  Seconds already credited, unmetered or in maintenance keep their bucket, so every rented
  second is still in exactly one bucket. A degraded migration's window stalls the job too:
  its degraded seconds before the window stay billed (unless ``bill_degraded`` is off).
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
  credit mirrors the charge it reverses. Evidence = first segment's / migration's.
* Net (rule "net = billable seconds x price"): per price period, charge + credits =
  round((charged s - credited s) x price) exactly; the credit lines share the difference by
  largest remainder (``lines.credit_lines``). So a customer who multiplies their billed
  seconds by the price gets the invoice's net, to the cent.
* Cap ("tier + cap"; the cap belongs with the GPU model's price, effective-dated with it):
  a capped rental pays at most its *allowance* = monthly cap per GPU x (GPU-seconds in
  billed buckets ÷ the billing period's seconds), summed over the capped price periods and
  rounded once. Seconds credited (failure, migration, degraded credit), in maintenance or
  unmetered and unbilled earn no allowance, so the cap shrinks with every credit and a
  credit always lowers what a capped customer pays; a rental that covers half the period
  (or uses one of its two GPUs) gets half the cap. When the net of the capped price periods
  exceeds the allowance, one negative cap line brings it down to the allowance. ``cap_period``
  is the full billing period when ``period`` is cut short (usage to date).
"""

from bisect import bisect_right
from collections import defaultdict
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from fractions import Fraction
from itertools import pairwise
from typing import NamedTuple, TypeVar

from app.billing.core.domain import (
    CREDIT_BUCKETS,
    Assignment,
    Bucket,
    Evidence,
    Migration,
    Piece,
    PlanTerms,
    PricePoint,
    RatingInputs,
    RentalInput,
    RentalSession,
    Segment,
)
from app.billing.core.intervals import Span, clip, merge, subtract
from app.billing.core.lines import (
    InvoiceLine,
    LineKind,
    cap_line,
    charge_line,
    credit_lines,
    sum_amounts,
)
from app.core.money import round_money, time_amount
from metering_agent.protocol import SEVERITY, GpuState


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
    maintenance = list(maintenance)
    if not maintenance and _disjoint_in_order(nonempty):
        return _plain_timeline(nonempty)
    return _swept_timeline(nonempty, maintenance)


def _swept_timeline(nonempty: list[Segment], maintenance: Iterable[Span]) -> Timeline:
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


def _disjoint_in_order(segments: Sequence[Segment]) -> bool:
    return all(a.end <= b.start for a, b in pairwise(segments))


def _plain_timeline(segments: Sequence[Segment]) -> Timeline:
    """The sweep's result when segments neither overlap nor meet maintenance (most GPUs):
    one cell per segment, fused as the sweep fuses them, without sorting events."""
    cells: list[_Cell] = []
    for s in segments:
        _extend(cells, _Cell(s.start, s.end, s, False))
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

    def cap(self, index: int) -> Decimal | None:
        return self.points[index].monthly_cap_per_gpu

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
    sessions: tuple[RentalSession, ...]
    lines: tuple[InvoiceLine, ...]
    buckets: Mapping[Bucket, int] = field(hash=False)
    cap_allowance: Decimal | None = None  # the most this rental's capped price periods cost
    period_s: int = 0  # the billing period's length the cap is prorated over

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

    @property
    def uncapped_net(self) -> Decimal:
        """Charges + credits: what the rental would cost without its cap."""
        lines = [line for line in self.lines if line.kind is not LineKind.CAP]
        return sum_amounts(lines, self.rental.plan.currency)


def rate_rental(inputs: RatingInputs, cap_period: Span | None = None) -> RatedRental:
    """The rating of the one rental of ``inputs``."""
    [rated] = rate_rentals(inputs, cap_period)
    return rated


def rate_rentals(inputs: RatingInputs, cap_period: Span | None = None) -> list[RatedRental]:
    cap_span = cap_period or inputs.period
    period_s = cap_span[1] - cap_span[0]
    classified = classify_rentals(inputs)
    return [
        _rated(
            c.rental,
            c.bounds,
            c.pieces,
            [_session(gpu, run, pieces, c.rental.plan) for gpu, run, pieces in c.runs],
            period_s,
        )
        for c in classified
    ]


class Classified(NamedTuple):
    """A rental's pieces over its bounds, and each session run's own pieces."""

    rental: RentalInput
    bounds: Span
    pieces: list[Piece]  # sorted by GPU and start, migration windows included
    runs: list[tuple[str, Span, list[Piece]]]  # (GPU, run, the run's pieces)


def classify_rentals(inputs: RatingInputs) -> list[Classified]:
    """Each rental's pieces over the period (sorted by GPU and start) and its session runs,
    without sessions or lines: what rollups store, and the live part of a read that
    ``rate_pieces`` then rates with the stored ones."""
    assignments_of = by_rental(inputs.assignments)
    migrations_of = by_rental(inputs.migrations)
    gpus = {a.gpu_uuid for r in inputs.rentals for a in assignments_of[r.rental_id]}
    timelines = {
        gpu: build_timeline(
            inputs.segments_by_gpu.get(gpu, ()), inputs.maintenance_by_gpu.get(gpu, ())
        )
        for gpu in gpus
    }
    return [
        _classify_rental(
            r, assignments_of[r.rental_id], migrations_of[r.rental_id], timelines, inputs.period
        )
        for r in inputs.rentals
    ]


_OfRental = TypeVar("_OfRental", Assignment, Migration)


def by_rental(items: Iterable[_OfRental]) -> defaultdict[str, list[_OfRental]]:
    """``items`` grouped by their rental (an empty list for a rental without any)."""
    out: defaultdict[str, list[_OfRental]] = defaultdict(list)
    for item in items:
        out[item.rental_id].append(item)
    return out


def price_at(rental: RentalInput, time: int) -> Decimal:
    """The rental's price per GPU-hour in effect at ``time``."""
    book = _PriceBook(rental.plan.price_points(rental.gpu_model))
    return book.price(book.index_at(time))


def rental_bounds(rental: RentalInput, period: Span) -> Span:
    """``period`` intersected with the rental: what rating clips everything to."""
    start = max(rental.rental_start, period[0])
    return start, max(start, rental.end_by(period[1]))


def session_runs(assignments: Iterable[Assignment], bounds: Span) -> dict[str, list[Span]]:
    """Each GPU's sessions: the union of its assignments, clipped to ``bounds``."""
    spans: dict[str, list[Span]] = defaultdict(list)
    for a in assignments:
        spans[a.gpu_uuid].append((a.start, a.end))
    return {
        gpu: merge(c for span in spans[gpu] if (c := clip(span, bounds))) for gpu in sorted(spans)
    }


def _classify_rental(
    rental: RentalInput,
    assignments: Sequence[Assignment],
    migrations: Sequence[Migration],
    timelines: Mapping[str, Timeline],
    period: Span,
) -> Classified:
    bounds = rental_bounds(rental, period)
    window_pieces = _window_pieces(migrations, bounds)
    holes: dict[str, list[Span]] = defaultdict(list)
    for m in migrations:
        holes[m.from_gpu].append((m.failed_at, m.resumed_at))
        holes[m.to_gpu].append((m.failed_at, m.resumed_at))
    runs = [
        (gpu, run, _classify(gpu, run, holes[gpu], timelines[gpu], rental.plan))
        for gpu, gpu_runs in session_runs(assignments, bounds).items()
        for run in gpu_runs
    ]
    if rental.plan.credit_stall:
        stalls = _stalls([p for _, _, run_pieces in runs for p in run_pieces] + window_pieces)
        runs = [(gpu, run, _stalled(run_pieces, stalls)) for gpu, run, run_pieces in runs]
    pieces = [p for _, _, run_pieces in runs for p in run_pieces] + window_pieces
    return Classified(rental, bounds, sorted(pieces, key=lambda p: (p.gpu_uuid, p.start)), runs)


def rate_pieces(
    rental: RentalInput,
    bounds: Span,
    pieces: Sequence[Piece],
    runs: Mapping[str, Sequence[Span]],
    period_s: int,
) -> RatedRental:
    """The rating of already classified ``pieces`` (sorted by GPU and start; e.g. stored
    daily rollups followed by the open day rated live): sessions, lines and the cap by the
    same rules as ``rate_rentals``. ``runs`` are the sessions per GPU (``session_runs``).
    A migration window belongs to no session (``_window_pieces``), wherever it lies: a stored
    piece no longer says so, but its bucket does."""
    of_gpu: dict[str, list[Piece]] = defaultdict(list)
    for piece in pieces:
        if piece.bucket is not Bucket.MIGRATION_CREDIT:
            of_gpu[piece.gpu_uuid].append(piece)
    sessions = [
        _session(gpu, run, [p for p in of_gpu[gpu] if run[0] <= p.start < run[1]], rental.plan)
        for gpu, gpu_runs in runs.items()
        for run in gpu_runs
    ]
    return _rated(rental, bounds, pieces, sessions, period_s)


def _rated(
    rental: RentalInput,
    bounds: Span,
    pieces: Sequence[Piece],
    sessions: Sequence[RentalSession],
    period_s: int,
) -> RatedRental:
    buckets = {b: 0 for b in Bucket}
    for piece in pieces:
        buckets[piece.bucket] += piece.seconds
    lines, allowance = _lines(rental, bounds, pieces, sessions, period_s)
    return RatedRental(
        rental, bounds, tuple(pieces), tuple(sessions), lines, buckets, allowance, period_s
    )


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


_STALLING = frozenset({Bucket.FAILURE_CREDIT, Bucket.MIGRATION_CREDIT})
_STALLABLE = frozenset({Bucket.BILLABLE, Bucket.DEGRADED})


class _Stall(NamedTuple):
    """A span in which one of the rental's GPUs could not run its part of the job."""

    start: int
    end: int
    gpu_uuid: str
    evidence: Evidence


def _stalls(pieces: Iterable[Piece]) -> list[_Stall]:
    """The failed and migrating pieces of a rental, by start: the spans its job is stalled."""
    return sorted(
        _Stall(p.start, p.end, p.gpu_uuid, _stall_evidence(p))
        for p in pieces
        if p.bucket in _STALLING
    )


def _stall_evidence(piece: Piece) -> Evidence:
    """What a stall credit shows: the GPU that stopped the job and why (its failure's health
    event, or the migration window's failover)."""
    return {"stalled_by": piece.gpu_uuid, "bucket": piece.bucket.value, **(piece.evidence or {})}


def _stalled(pieces: Sequence[Piece], stalls: Sequence[_Stall]) -> list[Piece]:
    """``pieces`` of one GPU with their billable and degraded seconds inside another GPU's
    stall turned into ``stall_credit`` (one piece per maximal run, with the evidence of the
    stall it begins in)."""
    out: list[Piece] = []
    for piece in pieces:
        others = [s for s in stalls if s.gpu_uuid != piece.gpu_uuid]
        if piece.bucket not in _STALLABLE or not others:
            out.append(piece)
            continue
        stalled = [c for s in others if (c := clip((s.start, s.end), (piece.start, piece.end)))]
        for start, end in subtract([(piece.start, piece.end)], stalled):
            out.append(replace(piece, start=start, end=end))
        for start, end in merge(stalled):
            cause = next(s for s in others if s.start <= start < s.end)
            out.append(
                replace(
                    piece, start=start, end=end, bucket=Bucket.STALL_CREDIT, evidence=cause.evidence
                )
            )
    return _fused(sorted(out, key=lambda p: p.start))


def _fused(pieces: Sequence[Piece]) -> list[Piece]:
    """Adjacent pieces of one bucket joined (the first one's evidence kept)."""
    out: list[Piece] = []
    for piece in pieces:
        if out and out[-1].end == piece.start and out[-1].bucket is piece.bucket:
            out[-1] = replace(out[-1], end=piece.end)
        else:
            out.append(piece)
    return out


def _classify(
    gpu: str, run: Span, holes: Sequence[Span], timeline: Timeline, plan: PlanTerms
) -> list[Piece]:
    pieces: list[Piece] = []  # fused while adjacent and in the same bucket
    for start, end in subtract([run], holes):
        for cell in timeline.cells_in(start, end):
            bucket = _bucket(cell, plan)
            if pieces and pieces[-1].end == cell.start and pieces[-1].bucket is bucket:
                pieces[-1] = replace(pieces[-1], end=cell.end)
                continue
            evidence = cell.segment.evidence if cell.segment and bucket in CREDIT_BUCKETS else None
            pieces.append(Piece(gpu, cell.start, cell.end, bucket, run[0], evidence))
    return pieces


def _session(gpu: str, run: Span, pieces: Sequence[Piece], plan: PlanTerms) -> RentalSession:
    """The increment and the minimum round the billed and the credited seconds together, and
    the credited ones then come off: a credit is refunded to the second, never rounded away,
    so a failure never raises what a session pays (rounding only the billed seconds let a
    credit in a cheap price period come back as rounding priced in a dearer one)."""
    billed = [p for p in pieces if is_billed(p.bucket, plan)]
    billed_s = sum(p.seconds for p in billed)
    if billed_s == 0:
        return RentalSession(gpu, run[0], run[1], 0, 0, None)
    counted = billed + [p for p in pieces if p.bucket in CREDIT_BUCKETS]
    counted_s = sum(p.seconds for p in counted)
    rounded_s = max(-(-counted_s // plan.increment_s) * plan.increment_s, plan.minimum_s)
    extra_at = max(p.end for p in counted) - 1
    return RentalSession(gpu, run[0], run[1], billed_s, billed_s + rounded_s - counted_s, extra_at)


class _PeriodTally:
    """What one price period of a rental adds up to."""

    def __init__(self) -> None:
        self.charged_s = 0  # billed seconds after increments + credited seconds
        self.credited: list[Piece] = []


def _lines(
    rental: RentalInput,
    bounds: Span,
    pieces: Sequence[Piece],
    sessions: Sequence[RentalSession],
    period_s: int,
) -> tuple[tuple[InvoiceLine, ...], Decimal | None]:
    plan, model, rental_id = rental.plan, rental.gpu_model, rental.rental_id
    currency = plan.currency
    book = _PriceBook(plan.price_points(model))
    tally: dict[int, _PeriodTally] = defaultdict(_PeriodTally)
    for piece in pieces:
        credited = piece.bucket in CREDIT_BUCKETS
        if not (credited or is_billed(piece.bucket, plan)):
            continue
        for index, (start, end) in book.split(piece.start, piece.end):
            tally[index].charged_s += end - start
            if credited:
                tally[index].credited.append(replace(piece, start=start, end=end))
    for session in sessions:
        if session.extra_priced_at is not None:
            tally[book.index_at(session.extra_priced_at)].charged_s += session.extra_s
    charges: list[InvoiceLine] = []
    credits: list[InvoiceLine] = []
    for i, t in sorted(tally.items()):
        price = book.price(i)
        charge = charge_line(
            rental_id, model, book.period_of(i, bounds), t.charged_s, price, currency
        )
        net = time_amount(t.charged_s - sum(p.seconds for p in t.credited), price, currency)
        charges.append(charge)
        credits += credit_lines(rental_id, model, t.credited, price, currency, charge.amount - net)
    lines = charges + credits
    caps = {i for i in tally if book.cap(i) is not None}
    if not caps:
        return tuple(lines), None
    billed = [p for p in pieces if is_billed(p.bucket, plan)]
    allowance = _allowance(book, billed, period_s, currency)
    capped_net = sum_amounts((x for x in lines if _price_index(book, x) in caps), currency)
    evidence = {
        "allowance": str(allowance),
        "capped_net": str(capped_net),
        "period_s": period_s,
        "caps_per_gpu": sorted({f"{(book.cap(i) or Decimal()).normalize():f}" for i in caps}),
    }
    if line := cap_line(rental_id, capped_net, allowance, currency, evidence):
        lines.append(line)
    return tuple(lines), allowance


def _price_index(book: _PriceBook, line: InvoiceLine) -> int:
    assert line.start is not None  # charge and credit lines carry their interval
    return book.index_at(line.start)


def _allowance(book: _PriceBook, pieces: Iterable[Piece], period_s: int, currency: str) -> Decimal:
    """Cap per GPU x GPU-seconds of ``pieces`` ÷ the period's seconds, over capped price
    periods, rounded once."""
    seconds: dict[int, int] = defaultdict(int)  # per price index: one Fraction each, not per piece
    for piece in pieces:
        for index, (start, end) in book.split(piece.start, piece.end):
            seconds[index] += end - start
    exact = Fraction()
    for index, n in seconds.items():
        if (cap := book.cap(index)) is not None:
            exact += Fraction(cap) * n / period_s
    return round_money(exact, currency)


def cap_allowance(rated: RatedRental, buckets: Collection[Bucket]) -> Decimal | None:
    """The rental's cap allowance had its seconds in ``buckets`` been the billed ones (the
    what-if's "without automatic credits" counts downtime as billed); None if uncapped."""
    if rated.cap_allowance is None:
        return None
    book = _PriceBook(rated.rental.plan.price_points(rated.rental.gpu_model))
    pieces = [p for p in rated.pieces if p.bucket in buckets]
    return _allowance(book, pieces, rated.period_s, rated.rental.plan.currency)
