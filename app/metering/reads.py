"""Console reads: a GPU's timeline and metrics, and fleet health.

Customers see only GPUs that served their rentals, and only the seconds of those rentals:
everything is clipped to the customer's assignment intervals of that GPU.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import TypeVar

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.auth.service import Principal
from app.core.epoch import epoch, from_epoch
from app.core.errors import Unprocessable, not_found
from app.fleet.models import Gpu
from app.metering import packing, repository, schemas
from app.metering.segments import Span, gaps
from app.rentals.models import GpuAssignment

_Number = TypeVar("_Number", int, float)

MAX_WINDOW_S = 31 * 86_400
MAX_POINTS = 10_000
FAILED_LOOKBACK_S = 86_400


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


def visible(
    session: Session, gpu_uuid: str, caller: Principal, start: int, end: int
) -> list[tuple[int, int]]:
    """The parts of [start, end) the caller may see of this GPU; 404 when none ever."""
    if session.get(Gpu, gpu_uuid) is None:
        raise not_found("GPU", gpu_uuid, ("path", "gpu_uuid"))
    if caller.customer_scope is None:
        return [(start, end)]
    rented = _rented(session, gpu_uuid, caller.customer_scope)
    if not rented:
        raise not_found("GPU", gpu_uuid, ("path", "gpu_uuid"))
    clipped = [(max(a, start), min(b, end)) for a, b in rented]
    return [(a, b) for a, b in clipped if a < b]


def _rented(session: Session, gpu_uuid: str, customer_id: uuid.UUID) -> list[tuple[int, int]]:
    rows = session.execute(
        select(GpuAssignment.start_at, GpuAssignment.end_at)
        .where(GpuAssignment.gpu_uuid == gpu_uuid, GpuAssignment.customer_id == customer_id)
        .order_by(GpuAssignment.start_at)
    )
    far_future = 2**62
    return [(epoch(a), far_future if b is None else epoch(b)) for a, b in rows]


def timeline(
    session: Session, gpu_uuid: str, caller: Principal, start: int, end: int
) -> schemas.Timeline:
    parts = visible(session, gpu_uuid, caller, start, end)
    segments, unmetered, events = [], [], []
    for lo, hi in parts:
        rows = repository.segments_between(session, [gpu_uuid], lo, hi)[gpu_uuid]
        spans = [Span(r.start, r.end, r.state, r.evidence) for r in rows]
        segments += [
            schemas.SegmentRead.of(s.start, s.end, state=s.state, evidence=s.evidence)
            for s in spans
        ]
        unmetered += [schemas.GapRead.of(a, b, seconds=b - a) for a, b in gaps(spans, lo, hi)]
        events += [
            schemas.EventRead(at=from_epoch(e["at"]), at_s=e["at"], **_without(e, "at"))
            for e in repository.events_between(session, gpu_uuid, lo, hi)
        ]
    return schemas.Timeline(
        gpu_uuid=gpu_uuid,
        start=from_epoch(start),
        end=from_epoch(end),
        segments=segments,
        unmetered=unmetered,
        events=events,
    )


def _without(row: dict, key: str) -> dict:
    return {k: v for k, v in row.items() if k != key}


def metrics(
    session: Session, gpu_uuid: str, caller: Principal, start: int, end: int, step: int
) -> schemas.Metrics:
    buckets: dict[int, list[packing.Minute]] = {}
    for lo, hi in visible(session, gpu_uuid, caller, start, end):
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


def fleet_health(session: Session, now: int) -> schemas.FleetHealth:
    counts = [
        schemas.StateCount(state=state or "unknown", pool=pool, gpus=n)
        for state, pool, n in repository.gpu_counts(session)
    ]
    failed = [
        schemas.FailedGpu(
            gpu_uuid=row["gpu_uuid"],
            node_id=row["node_id"],
            model=row["model"],
            since=from_epoch(row["start"]),
            until=from_epoch(row["end"]),
            evidence=row["evidence"],
        )
        for row in repository.failed_since(session, now - FAILED_LOOKBACK_S)
    ]
    return schemas.FleetHealth(at=from_epoch(now), by_state_and_pool=counts, recently_failed=failed)
