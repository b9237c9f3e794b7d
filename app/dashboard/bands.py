"""The rental page's state bands: one row per assigned GPU, read through the console's timeline.

Geometry is computed here (x in a 0..1000 viewBox), so the template only draws rectangles.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session

from app.auth.service import Principal
from app.dashboard.formatting import Formatter, duration, facts
from app.metering import reads
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
    x: float = 0.0
    w: float = 0.0


@dataclass(frozen=True)
class Mark:
    at: int
    kind: str
    tip: str
    x: float = 0.0


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
        start = max(lo, int(a.start_at.timestamp()))
        end = min(hi, hi if a.end_at is None else int(a.end_at.timestamp()))
        band = rows.setdefault(a.gpu_uuid, Band(a.gpu_uuid, len(rows)))
        if start < end:
            _add_timeline(band, reads.timeline(session, a.gpu_uuid, caller, start, end), fmt)
    links = [link for m in rental.migrations for link in _migration(m, rows, fmt, lo, hi)]
    chart = BandChart(lo, hi, list(rows.values()), links, _ticks(lo, hi, fmt))
    for band in chart.bands:
        band.pieces = [_placed(p, lo, hi) for p in band.pieces]
        band.marks = [_mark_placed(m, lo, hi) for m in band.marks]
    return chart


def _add_timeline(band: Band, timeline: Timeline, fmt: Formatter) -> None:
    for s in timeline.segments:
        band.pieces.append(
            Piece(s.start_s, s.end_s, s.state, _tip(s.state, s.start_s, s.end_s, fmt, s.evidence))
        )
    for g in timeline.unmetered:
        tip = _tip("unmetered", g.start_s, g.end_s, fmt, {"note": "no telemetry arrived"})
        band.pieces.append(Piece(g.start_s, g.end_s, "unmetered", tip))
    for e in timeline.events:
        label = f"{e.kind} {e.code}" if e.code is not None else e.kind
        evidence = facts({"rule": e.rule, "state": e.state, **e.detail})
        band.marks.append(Mark(e.at_s, e.kind, f"{label} at {fmt.datetime_s(e.at_s)}; {evidence}"))
    band.pieces.sort(key=lambda p: p.start)


def _migration(
    m: Migration, rows: dict[str, Band], fmt: Formatter, lo: int, hi: int
) -> Iterable[Link]:
    failed, resumed = int(m.failed_at.timestamp()), int(m.resumed_at.timestamp())
    start, end = max(lo, failed), min(hi, max(resumed, failed + 1))
    source, target = rows.get(m.from_gpu_uuid), rows.get(m.to_gpu_uuid)
    if start >= end or source is None or target is None:
        return []
    evidence = {"from": m.from_gpu_uuid, "to": m.to_gpu_uuid, "reason": m.reason}
    tip = _tip("migration", failed, resumed, fmt, evidence)
    source.pieces.append(Piece(start, end, "migration", tip))
    mid = ROW_H / 2
    return [
        Link(_x(start, lo, hi), source.y + mid, _x(end, lo, hi), target.y + mid, tip),
    ]


def _tip(state: str, start: int, end: int, fmt: Formatter, evidence: dict[str, Any] | None) -> str:
    head = f"{state}: {fmt.datetime_s(start)} to {fmt.datetime_s(end)} ({duration(end - start)})"
    return f"{head}; {facts(evidence)}" if evidence else head


def _x(t: int, lo: int, hi: int) -> float:
    return round((t - lo) / (hi - lo) * WIDTH, 2)


def _placed(p: Piece, lo: int, hi: int) -> Piece:
    x = _x(p.start, lo, hi)
    return Piece(p.start, p.end, p.state, p.tip, x, max(_x(p.end, lo, hi) - x, 0.5))


def _mark_placed(m: Mark, lo: int, hi: int) -> Mark:
    return Mark(m.at, m.kind, m.tip, _x(m.at, lo, hi))


def _ticks(lo: int, hi: int, fmt: Formatter, count: int = 5) -> list[tuple[float, str]]:
    """Evenly spaced labels, as percentages of the width; with hours when days would repeat."""
    step = (hi - lo) / count
    label = fmt.date if step >= 86_400 else fmt.datetime
    return [(i * 100 / count, label(int(lo + i * step))) for i in range(count + 1)]
