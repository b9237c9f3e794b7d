from __future__ import annotations

import uuid
from datetime import datetime
from decimal import Decimal
from typing import Any

from pydantic import Field

from app.core.schemas import Instant, Schema
from app.failover.models import Failover, FailoverState


class FailoverRead(Schema):
    id: uuid.UUID
    rental_id: uuid.UUID
    customer_id: uuid.UUID
    failed_gpu_uuid: str
    spare_gpu_uuid: str | None
    datacenter: str
    model: str
    topology_group: str | None
    state: FailoverState
    failed_at: datetime = Field(description="The first failed second, per telemetry.")
    detected_at: datetime = Field(description="When the service learned of the failure.")
    requested_at: datetime
    reserved_until: datetime | None
    resumed_at: datetime | None
    closed_at: datetime | None
    migration_id: int | None
    spare_preempted: bool = Field(
        description="The spare was taken from a preemptible rental (ended at the reservation)."
    )
    preempted_rental_id: uuid.UUID | None = Field(
        description="That rental, shown to admins and to the customer that rented it; null to "
        "anyone else."
    )
    evidence: list[dict[str, Any]]
    reason: str | None
    trigger: str = Field(
        description="failed: the GPU failed; degraded: the plan's spare policy moved a GPU "
        "degraded for too long (degraded_causes say why)."
    )
    degraded_causes: list[str]

    @classmethod
    def of(cls, failover: Failover, preempted_rental_id: uuid.UUID | None) -> FailoverRead:
        """The failover, with the preempted rental as its reader may see it."""
        return cls.model_validate(
            {
                **{name: getattr(failover, name) for name in _FAILOVER_COLUMNS},
                "spare_preempted": failover.preempted_rental_id is not None,
                "preempted_rental_id": preempted_rental_id,
            }
        )


class ResumedBody(Schema):
    resumed_at: Instant | None = Field(
        default=None, description="When the job ran on the spare again (default: now)."
    )


class AbandonedBody(Schema):
    reason: str = Field(min_length=1, max_length=500)


class LatencyFigures(Schema):
    count: int
    p50_s: float | None
    p99_s: float | None


class SiteLatency(Schema):
    datacenter: str
    model: str
    trigger: str = Field(description="`failed`, or `degraded` (moved by the plan's policy).")
    failovers: int
    detection: LatencyFigures = Field(description="First failed second -> service knows.")
    request: LatencyFigures = Field(description="First failed second -> failover requested.")
    resume: LatencyFigures = Field(description="First failed second -> job resumed.")


class FailoverSummary(Schema):
    sites: list[SiteLatency]


class SparePolicyWrite(Schema):
    datacenter: str = Field(min_length=1, max_length=100)
    model: str = Field(min_length=1, max_length=100)
    target_percent: Decimal = Field(ge=0, le=100, decimal_places=2)
    min_count: int = Field(default=0, ge=0, le=100_000)


class SparePolicyRead(Schema):
    datacenter: str
    model: str
    target_percent: Decimal
    min_count: int


class SparePoolRead(Schema):
    datacenter: str
    model: str
    total_gpus: int
    spare_gpus: int = Field(description="GPUs in the spare pool.")
    available: int = Field(
        description="Spares a failover may take now: idle or rented preemptibly, not failed, "
        "not reserved."
    )
    reserved: int = Field(description="Spares held by a requested failover.")
    preemptibly_rented: int = Field(description="Available spares rented preemptibly now.")
    in_use: int = Field(description="Spares a non-preemptible rental holds.")
    failed: int
    target: int = Field(description="max(min_count, ceil(target_percent % of total_gpus)).")
    target_percent: Decimal
    min_count: int
    below_target: bool
    preemptible_gpu_seconds: int = Field(
        description="GPU-seconds of this model here sold preemptibly in [start, end)."
    )
    preemptible_gpu_hours: Decimal
    start: datetime
    end: datetime


class SparePoolView(Schema):
    pools: list[SparePoolRead]


_FAILOVER_COLUMNS = [
    name
    for name in FailoverRead.model_fields
    if name not in ("spare_preempted", "preempted_rental_id")
]
