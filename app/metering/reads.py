"""Metering's read interface: a GPU's timeline and metrics over given parts of a window.

Tenancy-free: the caller (``app.fleet.telemetry``, the GPU sub-resources of the console API)
decides which parts of the window a principal may see and passes them in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, TypeVar

from sqlalchemy.orm import Session

from app.core.epoch import epoch, from_epoch
from app.core.errors import Unprocessable
from app.metering import packing, repository, schemas
from app.metering.segments import Span, gaps

_Number = TypeVar("_Number", int, float)

MAX_WINDOW_S = 31 * 86_400
MAX_POINTS = 10_000


def window(start: datetime, end: datetime, step: int = 60) -> tuple[int, int]:
    """Validated epoch bounds; naive datetimes are taken as UTC."""
    lo, hi = (epoch(_aware(t)) for t in (start, end))
    if hi <= lo:
        raise Unprocessable("end must be after start", ["query", "end"])
    if hi - lo > MAX_WINDOW_S or (hi - lo) // step > MAX_POINTS:
        raise Unprocessable(
            f"window too large: at most {MAX_WINDOW_S} s and {MAX_POINTS} steps",
            ["query", "end"],
        )
    return lo, hi


def _aware(t: datetime) -> datetime:
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def timeline(
    session: Session, gpu_uuid: str, parts: list[tuple[int, int]], start: int, end: int
) -> schemas.Timeline:
    """Segments, unmetered gaps and health events of ``parts`` of [start, end)."""
    return timelines(session, {gpu_uuid: parts}, start, end)[gpu_uuid]


def timelines(
    session: Session, parts_by_gpu: Mapping[str, list[tuple[int, int]]], start: int, end: int
) -> dict[str, schemas.Timeline]:
    """``timeline`` for many GPUs at once: two queries in all, not two per part."""
    gpus = list(parts_by_gpu)
    rows = repository.segments_between(session, gpus, start, end)
    events = repository.events_of(session, gpus, start, end)
    return {
        gpu: _timeline(gpu, parts, rows[gpu], events[gpu], start, end)
        for gpu, parts in parts_by_gpu.items()
    }


def _timeline(
    gpu_uuid: str,
    parts: list[tuple[int, int]],
    rows: list[repository.SegmentRow],
    events: list[dict[str, Any]],
    start: int,
    end: int,
) -> schemas.Timeline:
    """One GPU's timeline from its rows over the whole window, cut to ``parts``."""
    segments, unmetered, reads_ = [], [], []
    for lo, hi in parts:
        spans = [
            Span(max(r.start, lo), min(r.end, hi), r.state, r.evidence)
            for r in rows
            if r.start < hi and r.end > lo
        ]
        segments += [
            schemas.SegmentRead.of(s.start, s.end, state=s.state, evidence=s.evidence)
            for s in spans
        ]
        unmetered += [schemas.GapRead.of(a, b, seconds=b - a) for a, b in gaps(spans, lo, hi)]
        reads_ += [
            schemas.EventRead(at=from_epoch(e["at"]), at_s=e["at"], **_without(e, "at"))
            for e in events
            if lo <= e["at"] < hi
        ]
    return schemas.Timeline(
        gpu_uuid=gpu_uuid,
        start=from_epoch(start),
        end=from_epoch(end),
        segments=segments,
        unmetered=unmetered,
        events=reads_,
    )


def failed_since(session: Session, since: int) -> list[dict[str, Any]]:
    """Failed segments that began at or after ``since``, newest first."""
    return repository.failed_since(session, since)


def _without(row: dict, key: str) -> dict:
    return {k: v for k, v in row.items() if k != key}


def metrics(
    session: Session, gpu_uuid: str, parts: list[tuple[int, int]], step: int
) -> schemas.Metrics:
    """Minute metrics within ``parts``, aggregated to ``step`` seconds."""
    buckets: dict[int, list[packing.Minute]] = {}
    for lo, hi in parts:
        for m in repository.minute_rows(session, [gpu_uuid], lo, hi)[gpu_uuid]:
            buckets.setdefault(m.start - m.start % step, []).append(m)
    points = [_point(t, ms) for t, ms in sorted(buckets.items())]
    return schemas.Metrics(gpu_uuid=gpu_uuid, step=step, points=points)


def _point(t: int, ms: list[packing.Minute]) -> schemas.MetricPoint:
    observed = sum(m.observed_s for m in ms)
    util_n = sum(m.util_n for m in ms)
    mem_n = sum(m.mem_util_n for m in ms)
    energies = [m.energy_j for m in ms if m.energy_j is not None]
    energy = round(sum(energies), 1) if energies else None
    return schemas.MetricPoint(
        t=from_epoch(t),
        t_s=t,
        observed_s=observed,
        gpu_util_mean=round(sum(m.util_sum for m in ms) / util_n, 2) if util_n else None,
        gpu_util_max=_max(m.util_max for m in ms),
        mem_util_mean=round(sum(m.mem_util_sum for m in ms) / mem_n, 2) if mem_n else None,
        mem_used_max_mib=_max(m.mem_used_max_mib for m in ms),
        energy_j=energy,
        power_mean_w=round(energy / observed, 1) if energy is not None and observed else None,
        power_max_w=_max(m.power_max_w for m in ms),
        temp_max_c=_max(m.temp_max_c for m in ms),
    )


def _max(values: Iterable[_Number | None]) -> _Number | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None
