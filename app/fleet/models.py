from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from uuid import UUID, uuid4

from sqlalchemy import CheckConstraint, ForeignKey, Index, String
from sqlalchemy.orm import Mapped, mapped_column

from app.core.base import Base, Timestamped, pg_enum
from app.metering.models import GPU_MODEL_LENGTH, GPU_UUID_LENGTH


class Pool(StrEnum):
    RENTABLE = "rentable"
    SPARE = "spare"
    MAINTENANCE = "maintenance"
    # Reported by a node, not yet admitted by an operator (or the auto-admit policy): metered,
    # never assigned. A node's word alone does not put a GPU in the rentable pool.
    QUARANTINE = "quarantine"


class Node(Timestamped, Base):
    __tablename__ = "nodes"

    id: Mapped[UUID] = mapped_column(primary_key=True, default=uuid4)
    hostname: Mapped[str] = mapped_column(String(253), unique=True)
    datacenter: Mapped[str] = mapped_column(String(100))
    topology_group: Mapped[str | None] = mapped_column(String(100))


class Gpu(Timestamped, Base):
    """A GPU, identified by its NVML UUID; an operator registers it, or its node's first
    report does (in quarantine, unless ``gpu_auto_admit``)."""

    __tablename__ = "gpus"

    uuid: Mapped[str] = mapped_column(String(GPU_UUID_LENGTH), primary_key=True)
    node_id: Mapped[UUID] = mapped_column(ForeignKey("nodes.id"), index=True)
    model: Mapped[str] = mapped_column(String(GPU_MODEL_LENGTH))
    pool: Mapped[Pool] = mapped_column(pg_enum(Pool, "gpu_pool"), default=Pool.RENTABLE)
    # Last health state reported by the agent ("healthy", "degraded", "failed") and when.
    last_state: Mapped[str | None] = mapped_column(String(16))
    last_seen_at: Mapped[datetime | None]
    # Its NVML index on the node, as the agent reports it: a scheduler's GPU index -> UUID.
    device_index: Mapped[int | None]
    # Its device's minor number (/dev/nvidia<minor>), as the agent reports it: what a
    # scheduler's device files name (Slurm's gres.conf File=), whatever order NVML numbers in.
    minor_number: Mapped[int | None]
    # Since another node claimed its UUID: every node's reports of it are held until an
    # operator settles the clash (``service.settle``).
    disputed_at: Mapped[datetime | None]
    # Retired by an operator: no node's reports of it are kept any more.
    retired_at: Mapped[datetime | None]


class RefusedClaim(Base):
    """A node whose claim to a GPU an operator settled against (the GPU went to another node,
    or was retired): its reports of that GPU are refused, not held, so the clash stays settled."""

    __tablename__ = "gpu_refused_claims"

    gpu_uuid: Mapped[str] = mapped_column(ForeignKey("gpus.uuid"), primary_key=True)
    node_id: Mapped[UUID] = mapped_column(ForeignKey("nodes.id"), primary_key=True)
    reason: Mapped[str] = mapped_column(String(500))


class MaintenanceWindow(Timestamped, Base):
    """An interval during which the operator drained a GPU; rented seconds in it are not billed.
    ``created_at`` tells billing whether a window recorded late touches a finalized period."""

    __tablename__ = "gpu_maintenance_windows"
    __table_args__ = (
        CheckConstraint("end_at IS NULL OR end_at > start_at", name="end_after_start"),
        Index("ix_gpu_maintenance_windows_gpu_start", "gpu_uuid", "start_at"),
    )

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    gpu_uuid: Mapped[str] = mapped_column(ForeignKey("gpus.uuid"))
    start_at: Mapped[datetime]
    end_at: Mapped[datetime | None]
    reason: Mapped[str | None] = mapped_column(String(500))
