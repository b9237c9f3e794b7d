"""Failovers (a rented GPU failed: a spare chosen, reserved, requested, resumed or not) and the
hot-spare policy per GPU model and datacenter."""

from __future__ import annotations

import uuid
from datetime import datetime
from decimal import Decimal
from enum import StrEnum
from typing import Any

from sqlalchemy import CheckConstraint, Enum, ForeignKey, Index, Numeric, String, func, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from app.core.base import Base, Timestamped


class FailoverState(StrEnum):
    REQUESTED = "requested"  # a spare is reserved; the orchestrator is asked to move the job
    NO_SPARE = "no_spare"  # none free: the rental stays credited as failure until repair
    RESUMED = "resumed"  # the job runs on the spare; the migration is recorded
    ABANDONED = "abandoned"  # the orchestrator gave up; the spare is released
    EXPIRED = "expired"  # not confirmed in time; the spare is released
    RECOVERED = "recovered"  # (no spare) the failed GPU was repaired and serves on


class FailoverTrigger(StrEnum):
    FAILED = "failed"  # the GPU failed
    DEGRADED = "degraded"  # the plan's spare policy moves a GPU degraded for too long


OPEN_STATES = (FailoverState.REQUESTED, FailoverState.NO_SPARE)
_STATES = ", ".join(f"'{s.value}'" for s in FailoverState)
_OPEN = ", ".join(f"'{s.value}'" for s in OPEN_STATES)


class Failover(Timestamped, Base):
    __tablename__ = "failovers"
    __table_args__ = (
        CheckConstraint(f"state IN ({_STATES})", name="known_state"),
        CheckConstraint(
            "spare_gpu_uuid IS NOT NULL OR state IN ('no_spare', 'recovered', 'abandoned')",
            name="spare_unless_none",
        ),
        # No spare is promised twice: at most one requested failover holds a GPU.
        Index(
            "uq_failovers_reserved_spare",
            "spare_gpu_uuid",
            unique=True,
            postgresql_where=text("state = 'requested'"),
        ),
        # A GPU's failure opens one failover, however often its state change is re-sent.
        Index(
            "uq_failovers_open_failed_gpu",
            "failed_gpu_uuid",
            unique=True,
            postgresql_where=text(f"state IN ({_OPEN})"),
        ),
        Index("ix_failovers_site", "datacenter", "model"),
        CheckConstraint("trigger IN ('failed', 'degraded')", name="known_trigger"),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    rental_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("rentals.id"), index=True)
    customer_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("customers.id"), index=True)
    failed_gpu_uuid: Mapped[str] = mapped_column(ForeignKey("gpus.uuid"))
    spare_gpu_uuid: Mapped[str | None] = mapped_column(ForeignKey("gpus.uuid"))
    datacenter: Mapped[str] = mapped_column(String(100))
    model: Mapped[str] = mapped_column(String(100))
    topology_group: Mapped[str | None] = mapped_column(String(100))
    state: Mapped[FailoverState] = mapped_column(
        Enum(
            FailoverState,
            native_enum=False,
            create_constraint=False,  # known_state above
            length=16,
            values_callable=lambda members: [m.value for m in members],
        )
    )
    failed_at: Mapped[datetime]  # the first failed second, per telemetry
    detected_at: Mapped[datetime]  # when the service learned of it (ingest)
    requested_at: Mapped[datetime]
    reserved_until: Mapped[datetime | None]
    resumed_at: Mapped[datetime | None]
    closed_at: Mapped[datetime | None]
    migration_id: Mapped[int | None] = mapped_column(ForeignKey("rental_migrations.id"))
    preempted_rental_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("rentals.id"))
    evidence: Mapped[list[dict[str, Any]]] = mapped_column(JSONB, default=list)
    reason: Mapped[str | None] = mapped_column(String(500))
    trigger: Mapped[str] = mapped_column(
        String(16), default=FailoverTrigger.FAILED.value, server_default="failed"
    )
    # The degraded causes (app.metering.causes) that moved the GPU; [] for a failure.
    degraded_causes: Mapped[list[str]] = mapped_column(
        JSONB, default=list, server_default=text("'[]'::jsonb")
    )


class SparePolicy(Base):
    """How many hot spares one GPU model keeps in one datacenter: the larger of ``min_count``
    and ``target_percent`` of its GPUs. ``below_target`` remembers the last evaluation, so
    ``spare_pool.low`` is published once per crossing, not at every look."""

    __tablename__ = "spare_policies"
    __table_args__ = (
        CheckConstraint("target_percent >= 0 AND target_percent <= 100", name="percent_range"),
        CheckConstraint("min_count >= 0", name="min_count_not_negative"),
    )

    datacenter: Mapped[str] = mapped_column(String(100), primary_key=True)
    model: Mapped[str] = mapped_column(String(100), primary_key=True)
    target_percent: Mapped[Decimal] = mapped_column(Numeric(5, 2))
    min_count: Mapped[int] = mapped_column(default=0)
    below_target: Mapped[bool] = mapped_column(default=False)
    updated_at: Mapped[datetime] = mapped_column(server_default=func.now(), onupdate=func.now())
