"""Metering's read interface: a GPU's timeline and metrics over given parts of a window, and
the segments, idle minutes, late data and events billing and the dashboard read.

Tenancy-free: the caller (``app.fleet.telemetry``, the GPU sub-resources of the console API,
billing, the dashboard) decides which GPUs and parts of the window a principal may see and
passes them in. The rest of ``app.metering.repository`` is private to the package.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from sqlalchemy import BigInteger, Subquery, cast, extract, func, or_, select, text
from sqlalchemy.orm import Session

from app.core.db import pipelined
from app.core.epoch import epoch, from_epoch
from app.core.errors import Unprocessable
from app.metering import idle, packing, repository, schemas
from app.metering.models import HealthEventRow
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
    rows = segments_between(session, gpus, start, end)
    events = repository.events_of(session, gpus, start, end)
    return {
        gpu: _timeline(gpu, parts, rows[gpu], events[gpu], start, end)
        for gpu, parts in parts_by_gpu.items()
    }


def _timeline(
    gpu_uuid: str,
    parts: list[tuple[int, int]],
    rows: list[SegmentRow],
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
        for m in minute_rows(session, [gpu_uuid], lo, hi)[gpu_uuid]:
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


# --- a window's segments, minutes and events: billing's, the dashboard's and the console's --


@dataclass(frozen=True, slots=True)
class SegmentRow:
    gpu_uuid: str
    start: int
    end: int
    state: str
    evidence: dict[str, Any] | None


def segments_between(
    session: Session, gpu_uuids: Sequence[str], start: int, end: int
) -> dict[str, list[SegmentRow]]:
    """Each GPU's segments overlapping ``[start, end)``, clipped to it, sorted by start."""
    near = repository.segments_near(session, dict.fromkeys(gpu_uuids, (start, end)))
    out: dict[str, list[SegmentRow]] = {gpu: [] for gpu in gpu_uuids}
    for gpu, spans in near.items():
        out[gpu] = [
            SegmentRow(gpu, max(s.start, start), min(s.end, end), s.state, s.evidence)
            for s in spans
            if s.start < end and s.end > start
        ]
    return out


_HOURS_OVERLAPPING = text("""
SELECT gpu_uuid, hour, slots FROM (
    SELECT gpu_uuid, hour, slots FROM gpu_minute_metrics
    WHERE CAST(:idle AS smallint) IS NULL OR util_min_tenths < :idle
    UNION ALL SELECT gpu_uuid, hour, slots FROM gpu_minute_metrics_open
) AS m
WHERE gpu_uuid = ANY(CAST(:u AS text[])) AND hour >= :lo AND hour < :hi
ORDER BY gpu_uuid, hour
""")


def _metric_rows(
    session: Session,
    gpu_uuids: Sequence[str],
    start: int,
    end: int,
    *,
    idle_below_tenths: int | None = None,
) -> Iterable[tuple[str, int, bytes]]:
    """(GPU, hour, packed slots as stored) of the hours overlapping ``[start, end)``, closed
    and open; with ``idle_below_tenths``, only closed hours holding a minute below that
    utilisation."""
    params = {
        "u": list(gpu_uuids),
        "lo": packing.hour_of(start),
        "hi": end,
        "idle": idle_below_tenths,
    }
    [rows] = pipelined(session, [(_HOURS_OVERLAPPING, params)])  # binary: bytes, not hex
    return rows


def minute_rows(
    session: Session, gpu_uuids: Sequence[str], start: int, end: int
) -> dict[str, list[packing.Minute]]:
    """Each GPU's observed minutes whose start lies in ``[start, end)``, in time order."""
    out: dict[str, list[packing.Minute]] = {gpu: [] for gpu in gpu_uuids}
    for gpu, hour, slots in _metric_rows(session, gpu_uuids, start, end):
        minutes = packing.minutes(hour, packing.loaded(slots))
        out[gpu].extend(m for m in minutes if start <= m.start < end)
    return out


def idle_minutes(
    session: Session, gpu_uuids: Sequence[str], start: int, end: int, threshold_tenths: int
) -> dict[str, list[int]]:
    """Starts of each GPU's observed minutes in [start, end) with mean utilisation below
    ``threshold_tenths`` tenths of a percent, in time order."""
    out: dict[str, list[int]] = {gpu: [] for gpu in gpu_uuids}
    rows = _metric_rows(session, gpu_uuids, start, end, idle_below_tenths=threshold_tenths)
    for gpu, hour, slots in rows:
        minutes = idle.idle_minutes(hour, slots, threshold_tenths)
        inside = start <= hour and hour + packing.HOUR <= end  # most hours: nothing to clip
        out[gpu].extend(minutes if inside else (m for m in minutes if start <= m < end))
    return out


def late_segments_since(
    session: Session, gpu_uuids: Sequence[str], start: int, end: int, since: datetime
) -> bool:
    """Whether telemetry received after ``since`` created or changed a segment in [start, end)."""
    return bool(
        session.scalar(
            text("""
            SELECT EXISTS (SELECT 1 FROM gpu_state_segments
                WHERE gpu_uuid = ANY(CAST(:u AS text[])) AND start < :end AND "end" > :start
                  AND received_at > :since)
            """),
            {"u": list(gpu_uuids), "start": start, "end": end, "since": since},
        )
    )


def events_while_held(
    session: Session, held: Subquery, lo: int, hi: int, limit: int, *, failures_only: bool
) -> list[dict[str, Any]]:
    """Newest first: events of [lo, hi) on the GPUs of ``held`` (assignment intervals
    ``rental_id, gpu_uuid, start_at, end_at``, as rentals' ``served``) while held; with
    ``failures_only``, only the state changes to ``failed``.

    An interval's end second is included: a migration ends the failed GPU's assignment at
    ``failed_at``, the very second of the failure event that caused it."""
    held_from = func.greatest(cast(extract("epoch", held.c.start_at), BigInteger), lo)
    held_end = cast(extract("epoch", held.c.end_at), BigInteger)
    e = HealthEventRow
    received_s = cast(extract("epoch", e.received_at), BigInteger).label("received_s")
    query = (
        select(e.event_id, e.gpu_uuid, e.at, e.kind, e.code, e.state, e.rule, e.detail)
        .add_columns(held.c.rental_id, received_s)
        .join(held, e.gpu_uuid == held.c.gpu_uuid)
        .where(e.at >= held_from, e.at < hi, or_(held.c.end_at.is_(None), e.at <= held_end))
        .order_by(e.at.desc(), e.event_id)
        .limit(limit)
    )
    if failures_only:
        query = query.where(e.kind == "state_change", e.state == "failed")
    return [dict(row._mapping) for row in session.execute(query)]


_FAILURES = text("""
SELECT event_id, gpu_uuid, at, code, rule, detail,
  extract(epoch FROM received_at)::bigint AS received_s
FROM health_events
WHERE kind = 'state_change' AND state = 'failed' AND at >= :since AND at < :until
ORDER BY at DESC, event_id
LIMIT :limit
""")


def failures_between(session: Session, since: int, until: int, limit: int) -> list[dict[str, Any]]:
    """The newest ``limit`` changes to ``failed`` in [since, until), newest first, each with
    when the service heard of it."""
    params = {"since": since, "until": until, "limit": limit}
    return [dict(r._mapping) for r in session.execute(_FAILURES, params)]
