from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import CheckConstraint, ForeignKey, Index, String, func
from sqlalchemy.orm import Mapped, mapped_column, relationship

from app.core.base import Base, Timestamped

NAME_MAX = 100  # characters of a rental's name
MAX_GPUS = 100_000  # GPUs in one rental (app.core.money.MAX_HOURLY_PRICE counts on it)


class Rental(Timestamped, Base):
    __tablename__ = "rentals"
    __table_args__ = (
        CheckConstraint("end_at IS NULL OR end_at > start_at", name="end_after_start"),
        CheckConstraint("gpu_count >= 1", name="gpu_count_positive"),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    customer_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("customers.id"), index=True)
    plan_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("price_plans.id"))
    # What the customer calls it (pages fall back to its GPUs and dates); a rename is no
    # billing change, so it leaves changed_at alone.
    name: Mapped[str | None] = mapped_column(String(NAME_MAX))
    gpu_model: Mapped[str] = mapped_column(String(100))
    gpu_count: Mapped[int]
    start_at: Mapped[datetime]
    end_at: Mapped[datetime | None]
    # A preemptible rental runs on an idle hot spare at the plan's preemptible price; a
    # failover that needs the spare ends it at that second (preempted_at), without a credit.
    preemptible: Mapped[bool] = mapped_column(default=False, server_default="false")
    preempted_at: Mapped[datetime | None]
    # When the row last changed (created, ended): billing compares it to finalized_at.
    changed_at: Mapped[datetime] = mapped_column(server_default=func.now(), onupdate=func.now())

    assignments: Mapped[list[GpuAssignment]] = relationship(
        order_by="GpuAssignment.start_at", lazy="selectin", viewonly=True
    )
    migrations: Mapped[list[Migration]] = relationship(
        order_by="Migration.failed_at", lazy="selectin", viewonly=True
    )


class GpuAssignment(Base):
    """Which GPU served which rental over [start_at, end_at); end_at NULL while it still does.

    No two assignments of one GPU overlap: checked with a clear error in the service and
    enforced by a trigger (see the foundation migration) against concurrent writers.
    """

    __tablename__ = "gpu_assignments"
    __table_args__ = (
        CheckConstraint("end_at IS NULL OR end_at > start_at", name="end_after_start"),
        Index("ix_gpu_assignments_gpu_start", "gpu_uuid", "start_at"),
    )

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    rental_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("rentals.id"), index=True)
    # Distribution key (Citus-ready): every rental-side table carries its customer.
    customer_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("customers.id"), index=True)
    gpu_uuid: Mapped[str] = mapped_column(ForeignKey("gpus.uuid"))
    start_at: Mapped[datetime]
    end_at: Mapped[datetime | None]
    # When the row last changed (created, ended): billing compares it to finalized_at.
    changed_at: Mapped[datetime] = mapped_column(server_default=func.now(), onupdate=func.now())


class Migration(Timestamped, Base):
    """A rental moved from a failed GPU to another: [failed_at, resumed_at) is credited."""

    __tablename__ = "rental_migrations"
    __table_args__ = (
        CheckConstraint("resumed_at >= failed_at", name="resumed_after_failed"),
        CheckConstraint("from_gpu_uuid <> to_gpu_uuid", name="different_gpus"),
    )

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    rental_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("rentals.id"), index=True)
    customer_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("customers.id"), index=True)
    from_gpu_uuid: Mapped[str] = mapped_column(ForeignKey("gpus.uuid"))
    to_gpu_uuid: Mapped[str] = mapped_column(ForeignKey("gpus.uuid"))
    failed_at: Mapped[datetime]
    resumed_at: Mapped[datetime]
    reason: Mapped[str | None] = mapped_column(String(500))
