"""Metering tables: state segments (billing), packed minute metrics (charts), health events.

Time columns are integer UTC epoch seconds (BIGINT). See ``app.metering.service`` for how
ingest writes them and how late data is marked for billing. The tables that grow with time are
partitioned by month on their time column, which every primary key therefore includes
(``app.metering.retention`` creates and drops the partitions; migration 0012). Storage options
(fillfactor, toast_tuple_target) are each partition's: a partitioned parent takes none.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from sqlalchemy import (
    CheckConstraint,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    SmallInteger,
    String,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from app.core.base import Base
from app.metering.idle import UNSUMMARISED

# How long the GPU identity an agent reports may be; the fleet's gpus table uses the same.
GPU_UUID_LENGTH = 96
GPU_MODEL_LENGTH = 100


class StateSegment(Base):
    """A maximal run ``[start, end)`` of one state of one GPU, extended in place while it holds.

    ``received_at`` moves whenever telemetry creates or changes the row: billing re-rates a
    finalized period when a segment overlapping it was received after the finalization.
    Fillfactor 70 (per partition) leaves room on each page so extending ``end`` is a HOT
    update (no index write). Partitioned by ``start``: a segment stays in its start's month.
    """

    __tablename__ = "gpu_state_segments"
    __table_args__ = (
        CheckConstraint('"end" > start', name="end_after_start"),
        # Fleet health lists recent failures; failed runs are rare, so the index stays small.
        Index(
            "ix_gpu_state_segments_failed_start", "start", postgresql_where=text("state = 'failed'")
        ),
        {"postgresql_partition_by": "RANGE (start)"},
    )

    gpu_uuid: Mapped[str] = mapped_column(
        String(GPU_UUID_LENGTH), ForeignKey("gpus.uuid"), primary_key=True
    )
    start: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    end: Mapped[int]
    state: Mapped[str] = mapped_column(String(16))
    # The health event (rule, XID, counter deltas) that started this run; None when unknown.
    evidence: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    received_at: Mapped[datetime] = mapped_column(server_default=func.now())


class MinuteMetrics(Base):
    """Closed hours of minute metrics: one GPU-hour's 60 fixed-size slots packed in ``slots``
    (see packing). Written once when a GPU reports a later hour: dense, no update bloat.

    Rewriting a 1.2 KB row on every batch in one big table left ~7 KB per GPU-hour of dead
    versions (measured), hence the split. Late data for a closed hour updates it in place.
    Slots are deflated by ``packing.stored`` (Postgres leaves values of rows under ~2 KB
    uncompressed) and kept in the row (``STORAGE MAIN``, migration 0012). Partitioned by
    ``hour``.
    """

    __tablename__ = "gpu_minute_metrics"
    __table_args__ = (
        # The hours closed at an hour's turn, raw and not yet summarised (app.metering.summaries).
        Index(
            "ix_gpu_minute_metrics_unsummarised",
            "hour",
            postgresql_where=text(f"util_min_tenths = {UNSUMMARISED}"),
        ),
        {"postgresql_partition_by": "RANGE (hour)"},
    )

    gpu_uuid: Mapped[str] = mapped_column(
        String(GPU_UUID_LENGTH), ForeignKey("gpus.uuid"), primary_key=True
    )
    hour: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)  # epoch s, UTC
    mem_total_mib: Mapped[int | None] = mapped_column(Integer)
    slots: Mapped[bytes] = mapped_column(LargeBinary)
    # idle.util_floor_tenths(slots): lets idle-time reads skip busy hours without fetching them
    # (or UNSUMMARISED, until the summaries job computes it).
    util_min_tenths: Mapped[int | None] = mapped_column(SmallInteger)


class OpenMinuteMetrics(Base):
    """Each GPU's newest hour, still being filled: one row per GPU, rewritten once per batch.

    Keyed by GPU alone, so that moving to the next hour (the old one goes to the closed table)
    changes no indexed column: every rewrite is a HOT update into the page's free space, which
    pruning reclaims without VACUUM, and the table stays at its working set. Slots stay raw
    and in the row (``STORAGE MAIN``).
    """

    __tablename__ = "gpu_minute_metrics_open"
    __table_args__ = ({"postgresql_with": {"fillfactor": 50, "toast_tuple_target": 128}},)

    gpu_uuid: Mapped[str] = mapped_column(
        String(GPU_UUID_LENGTH), ForeignKey("gpus.uuid"), primary_key=True
    )
    hour: Mapped[int]  # epoch s, UTC
    mem_total_mib: Mapped[int | None] = mapped_column(Integer)
    slots: Mapped[bytes] = mapped_column(LargeBinary)


class HealthEventRow(Base):
    """A health event as the agent reported it (XID, counter jump, state change, clock jump).

    Keyed by GPU and the agent's event id: an id is only unique on its own GPU, so another
    node sending the same id can never suppress this GPU's event. Partitioned by ``at``, so
    the key includes it: an id re-sent with another ``at`` is a second row, which ingest's
    content check (same GPU and id, other content) refuses as a conflict."""

    __tablename__ = "health_events"
    __table_args__ = (
        Index("ix_health_events_gpu_at", "gpu_uuid", "at"),
        {"postgresql_partition_by": "RANGE (at)"},
    )

    gpu_uuid: Mapped[str] = mapped_column(
        String(GPU_UUID_LENGTH), ForeignKey("gpus.uuid"), primary_key=True
    )
    event_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    at: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    kind: Mapped[str] = mapped_column(String(16))
    code: Mapped[int | None] = mapped_column(Integer)
    state: Mapped[str | None] = mapped_column(String(16))
    rule: Mapped[str | None] = mapped_column(String(100))
    detail: Mapped[dict[str, Any]] = mapped_column(JSONB)
    received_at: Mapped[datetime] = mapped_column(server_default=func.now())


class HeldItem(Base):
    """A record or event a node reported for a GPU in dispute (two nodes claimed its UUID),
    kept as it arrived until an operator settles the clash: then stored, if its node is the
    one the GPU is settled to, or reported refused. At most ``ingest_hold_max`` per GPU."""

    __tablename__ = "held_telemetry"
    __table_args__ = (Index("ix_held_telemetry_gpu_node", "gpu_uuid", "node_id"),)

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    gpu_uuid: Mapped[str] = mapped_column(String(GPU_UUID_LENGTH), ForeignKey("gpus.uuid"))
    node_id: Mapped[UUID] = mapped_column(ForeignKey("nodes.id"))
    kind: Mapped[str] = mapped_column(String(8))  # "record" or "event"
    item: Mapped[dict[str, Any]] = mapped_column(JSONB)  # as the wire format has it
    held_at: Mapped[datetime] = mapped_column(server_default=func.now())
