"""The rental page's state bands: one row per assigned GPU, read through the console's timeline.

Geometry is computed here (x in a 0..1000 viewBox), so the template only draws rectangles.
A rental with more GPUs than a page holds is paged (the GPUs in the order the rental got
them): a 3,000-GPU rental's page reads and draws 64 timelines, not 3,000.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy.orm import Session

from app.auth.service import Principal
from app.core.epoch import epoch
from app.core.errors import Unprocessable
from app.dashboard import wording
from app.dashboard.formatting import Formatter
from app.fleet import telemetry
from app.metering.schemas import Timeline
from app.rentals.models import Migration, Rental

WIDTH = 1000
ROW_H = 32
GPUS_PER_PAGE = 64


@dataclass(frozen=True)
class Piece:
    start: int
    end: int
    state: str  # healthy | degraded | failed | maintenance | unmetered | migration
    tip: str
    x: float
    w: float


@dataclass(frozen=True)
class Mark:
    at: int
    kind: str
    tip: str
    x: float


@dataclass(frozen=True)
class Incident:
    """A failure or migration marked above its row at a fixed size, so that even a
    30-second event is visible and clickable on a month's chart."""

    start: int
    end: int
    kind: str  # failed | migration
    tip: str
    pct: float  # left edge, percent of the width


@dataclass
class Band:
    gpu_uuid: str
    row: int
    pieces: list[Piece] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)
    incidents: list[Incident] = field(default_factory=list)
    last_start: int = 0  # the latest assignment start on this GPU

    @property
    def y(self) -> int:
        return self.row * ROW_H


@dataclass(frozen=True)
class Link:
    """A migration drawn from the failed GPU's row to the new GPU's row."""

    x1: float
    y1: float
    x2: float
    y2: float
    tip: str


@dataclass
class BandChart:
    start: int
    end: int
    bands: list[Band]
    links: list[Link]
    ticks: list[tuple[float, str]]
    page: int = 1
    pages: int = 1
    gpus: int = 0  # the rental's GPUs, on every page

    @property
    def first(self) -> int:
        """The 1-based number of this page's first GPU."""
        return (self.page - 1) * GPUS_PER_PAGE + 1

    @property
    def height(self) -> int:
        return max(1, len(self.bands)) * ROW_H

    @property
    def current_gpu(self) -> str | None:
        """The GPU the rental holds last in the window: what the metric charts open on."""
        return max(self.bands, key=lambda b: b.last_start).gpu_uuid if self.bands else None


def build(
    session: Session,
    rental: Rental,
    caller: Principal,
    fmt: Formatter,
    window: tuple[int, int],
    page: int = 1,
) -> BandChart:
    lo, hi = window
    parts: dict[str, list[tuple[int, int]]] = {}  # every assigned GPU, in assignment order
    last_start: dict[str, int] = {}
    for a in rental.assignments:
        start = max(lo, epoch(a.start_at))
        end = min(hi, hi if a.end_at is None else epoch(a.end_at))
        gpu_parts = parts.setdefault(a.gpu_uuid, [])
        if start < end:
            last_start[a.gpu_uuid] = max(last_start.get(a.gpu_uuid, 0), start)
            gpu_parts.append((start, end))
    pages = max(1, -(-len(parts) // GPUS_PER_PAGE))
    if page > pages:
        raise Unprocessable(
            f"gpu_page {page} is past the last page ({pages}) of GPUs in this rental",
            ("query", "gpu_page"),
        )
    shown = list(parts)[(page - 1) * GPUS_PER_PAGE : page * GPUS_PER_PAGE]
    rows = {g: Band(g, i, last_start=last_start.get(g, 0)) for i, g in enumerate(shown)}
    # One read for the page's assignments (was one timeline call, ~4 queries, per assignment).
    wanted = {g: parts[g] for g in shown if parts[g]}
    for gpu, timeline in telemetry.timelines(session, caller, wanted, lo, hi).items():
        _add_timeline(rows[gpu], timeline, fmt, window)
    links = [link for m in rental.migrations if (link := _migration(m, rows, fmt, window))]
    ticks = _ticks(lo, hi, fmt)
    return BandChart(lo, hi, list(rows.values()), links, ticks, page, pages, len(parts))


def _add_timeline(band: Band, timeline: Timeline, fmt: Formatter, window: tuple[int, int]) -> None:
    for s in timeline.segments:
        tip = _tip(s.state, s.start_s, s.end_s, fmt, wording.evidence(s.evidence))
        band.pieces.append(_piece(s.start_s, s.end_s, s.state, tip, window))
        if s.state == "failed":
            band.incidents.append(_incident(s.start_s, s.end_s, "failed", tip, window))
    for g in timeline.unmetered:
        tip = _tip("unmetered", g.start_s, g.end_s, fmt, "no telemetry arrived from the node")
        band.pieces.append(_piece(g.start_s, g.end_s, "unmetered", tip, window))
    for e in timeline.events:
        what = wording.event(e.kind, e.code, e.state, {"rule": e.rule, "detail": e.detail})
        tip = f"{what}, {fmt.datetime_s(e.at_s)}"
        band.marks.append(Mark(e.at_s, e.kind, tip, _x(e.at_s, window)))
    band.pieces.sort(key=lambda p: p.start)


def _migration(
    m: Migration, rows: dict[str, Band], fmt: Formatter, window: tuple[int, int]
) -> Link | None:
    lo, hi = window
    failed, resumed = epoch(m.failed_at), epoch(m.resumed_at)
    start, end = max(lo, failed), min(hi, max(resumed, failed + 1))
    source, target = rows.get(m.from_gpu_uuid), rows.get(m.to_gpu_uuid)
    if start >= end or source is None:
        return None
    moved = f"from {m.from_gpu_uuid} to {m.to_gpu_uuid}" + (f": {m.reason}" if m.reason else "")
    tip = _tip("migration", failed, resumed, fmt, moved)
    source.pieces.append(_piece(start, end, "migration", tip, window))
    source.incidents.append(_incident(start, end, "migration", tip, window))
    if target is None:  # on another page of the rental's GPUs: the band, without the link
        return None
    mid = ROW_H / 2
    return Link(_x(start, window), source.y + mid, _x(end, window), target.y + mid, tip)


def _tip(state: str, start: int, end: int, fmt: Formatter, cause: str = "") -> str:
    head = f"{wording.state(state)} {wording.span(start, end, fmt)}"
    return f"{head} · {cause}" if cause else head


def _incident(start: int, end: int, kind: str, tip: str, window: tuple[int, int]) -> Incident:
    return Incident(start, end, kind, tip, round(_x(start, window) / WIDTH * 100, 2))


def _x(t: int, window: tuple[int, int]) -> float:
    lo, hi = window
    return round((t - lo) / (hi - lo) * WIDTH, 2)


def _piece(start: int, end: int, state: str, tip: str, window: tuple[int, int]) -> Piece:
    x = _x(start, window)
    return Piece(start, end, state, tip, x, max(_x(end, window) - x, 0.5))


# Tick steps, shortest first; the first that gives at most MAX_TICKS labels is used.
_STEPS = [3600 * h for h in (1, 2, 3, 6, 12)] + [86_400 * d for d in (1, 2, 7, 14)]
MAX_TICKS = 5


def _ticks(lo: int, hi: int, fmt: Formatter) -> list[tuple[float, str]]:
    """Labels at whole local hours or days (percent of the width), few enough not to overlap:
    ISO dates (``2026-10-10``), or ``10-10 14:00`` when the steps are hours."""
    step = next((s for s in _STEPS if (hi - lo) / s <= MAX_TICKS), _STEPS[-1])
    offset = int(fmt.local(lo).utcoffset().total_seconds())  # type: ignore[union-attr]
    first = lo - (lo + offset) % step + (step if (lo + offset) % step else 0)
    label = fmt.date if step >= 86_400 else (lambda t: fmt.local(t).strftime("%m-%d %H:%M"))
    return [(round((t - lo) / (hi - lo) * 100, 2), label(t)) for t in range(first, hi, step)]
