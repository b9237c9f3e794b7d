"""The rental page's state bands: one row per assigned GPU, read through the console's timeline.

Geometry is computed here (x in a 0..1000 viewBox), so the template only draws rectangles.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session

from app.auth.service import Principal
from app.core.epoch import epoch
from app.dashboard.formatting import Formatter, duration, facts
from app.fleet import telemetry
from app.metering.schemas import Timeline
from app.rentals.models import Migration, Rental

WIDTH = 1000
ROW_H = 32


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


@dataclass
class Band:
    gpu_uuid: str
    row: int
    pieces: list[Piece] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)

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

    @property
    def height(self) -> int:
        return max(1, len(self.bands)) * ROW_H


def build(
    session: Session, rental: Rental, caller: Principal, fmt: Formatter, window: tuple[int, int]
) -> BandChart:
    lo, hi = window
    rows: dict[str, Band] = {}
    for a in rental.assignments:
        start = max(lo, epoch(a.start_at))
        end = min(hi, hi if a.end_at is None else epoch(a.end_at))
        band = rows.setdefault(a.gpu_uuid, Band(a.gpu_uuid, len(rows)))
        if start < end:
            timeline = telemetry.timeline(session, a.gpu_uuid, caller, start, end)
            _add_timeline(band, timeline, fmt, window)
    links = [link for m in rental.migrations if (link := _migration(m, rows, fmt, window))]
    return BandChart(lo, hi, list(rows.values()), links, _ticks(lo, hi, fmt))


def _add_timeline(band: Band, timeline: Timeline, fmt: Formatter, window: tuple[int, int]) -> None:
    for s in timeline.segments:
        tip = _tip(s.state, s.start_s, s.end_s, fmt, s.evidence)
        band.pieces.append(_piece(s.start_s, s.end_s, s.state, tip, window))
    for g in timeline.unmetered:
        tip = _tip("unmetered", g.start_s, g.end_s, fmt, {"note": "no telemetry arrived"})
        band.pieces.append(_piece(g.start_s, g.end_s, "unmetered", tip, window))
    for e in timeline.events:
        label = f"{e.kind} {e.code}" if e.code is not None else e.kind
        evidence = facts({"rule": e.rule, "state": e.state, **e.detail})
        tip = f"{label} at {fmt.datetime_s(e.at_s)}; {evidence}"
        band.marks.append(Mark(e.at_s, e.kind, tip, _x(e.at_s, window)))
    band.pieces.sort(key=lambda p: p.start)


def _migration(
    m: Migration, rows: dict[str, Band], fmt: Formatter, window: tuple[int, int]
) -> Link | None:
    lo, hi = window
    failed, resumed = epoch(m.failed_at), epoch(m.resumed_at)
    start, end = max(lo, failed), min(hi, max(resumed, failed + 1))
    source, target = rows.get(m.from_gpu_uuid), rows.get(m.to_gpu_uuid)
    if start >= end or source is None or target is None:
        return None
    evidence = {"from": m.from_gpu_uuid, "to": m.to_gpu_uuid, "reason": m.reason}
    tip = _tip("migration", failed, resumed, fmt, evidence)
    source.pieces.append(_piece(start, end, "migration", tip, window))
    mid = ROW_H / 2
    return Link(_x(start, window), source.y + mid, _x(end, window), target.y + mid, tip)


def _tip(state: str, start: int, end: int, fmt: Formatter, evidence: dict[str, Any] | None) -> str:
    head = f"{state}: {fmt.datetime_s(start)} to {fmt.datetime_s(end)} ({duration(end - start)})"
    return f"{head}; {facts(evidence)}" if evidence else head


def _x(t: int, window: tuple[int, int]) -> float:
    lo, hi = window
    return round((t - lo) / (hi - lo) * WIDTH, 2)


def _piece(start: int, end: int, state: str, tip: str, window: tuple[int, int]) -> Piece:
    x = _x(start, window)
    return Piece(start, end, state, tip, x, max(_x(end, window) - x, 0.5))


def _ticks(lo: int, hi: int, fmt: Formatter, count: int = 5) -> list[tuple[float, str]]:
    """Evenly spaced labels, as percentages of the width; with hours when days would repeat."""
    step = (hi - lo) / count
    label = fmt.date if step >= 86_400 else fmt.datetime
    return [(i * 100 / count, label(int(lo + i * step))) for i in range(count + 1)]
