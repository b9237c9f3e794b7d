"""Console read models. Times are timezone-aware UTC, with the epoch second alongside."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from app.core.epoch import from_epoch
from app.core.schemas import Schema


class Interval(Schema):
    start: datetime
    end: datetime
    start_s: int
    end_s: int

    @classmethod
    def of(cls, start: int, end: int, **fields: Any) -> Any:
        return cls(start=from_epoch(start), end=from_epoch(end), start_s=start, end_s=end, **fields)


class SegmentRead(Interval):
    state: str
    evidence: dict[str, Any] | None


class GapRead(Interval):
    seconds: int


class EventRead(Schema):
    event_id: str
    at: datetime
    at_s: int
    kind: str
    code: int | None
    state: str | None
    rule: str | None
    detail: dict[str, Any]


class Timeline(Schema):
    gpu_uuid: str
    start: datetime
    end: datetime
    segments: list[SegmentRead]
    unmetered: list[GapRead]  # seconds without telemetry (within the caller's visible time)
    events: list[EventRead]


class MetricPoint(Schema):
    t: datetime
    t_s: int
    observed_s: int
    gpu_util_mean: float | None
    gpu_util_max: int | None
    mem_util_mean: float | None
    mem_used_max_mib: int | None
    energy_j: float | None
    power_mean_w: float | None  # energy / observed seconds
    power_max_w: float | None
    temp_max_c: int | None


class Metrics(Schema):
    gpu_uuid: str
    step: int
    points: list[MetricPoint]  # only steps with observed minutes


class StateCount(Schema):
    state: str  # "unknown" for GPUs that never reported
    pool: str
    gpus: int


class FailedGpu(Schema):
    gpu_uuid: str
    node_id: UUID
    model: str
    since: datetime
    until: datetime  # end of the failed run as reported so far
    evidence: dict[str, Any] | None


class FleetHealth(Schema):
    at: datetime
    by_state_and_pool: list[StateCount]
    recently_failed: list[FailedGpu]
