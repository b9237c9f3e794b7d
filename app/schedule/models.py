"""One row per (period, billing time zone) the scheduled invoice run has taken on.

The unique key makes the run of a zone's month happen once however many workers tick; the row
lock (``FOR UPDATE SKIP LOCKED``) keeps two workers off one zone at the same time.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import Integer, String, UniqueConstraint
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from app.core.base import Base, Timestamped, pg_enum


class RunStatus(StrEnum):
    PENDING = "pending"  # due; the next tick runs it
    SUCCEEDED = "succeeded"  # drafted (and finalized, per the setting): never run again
    FAILED = "failed"  # the last try failed; the next tick tries again, at most MAX_ATTEMPTS


class ScheduledRun(Timestamped, Base):
    __tablename__ = "scheduled_invoice_runs"
    __table_args__ = (UniqueConstraint("period", "timezone"),)

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    period: Mapped[str] = mapped_column(String(7))
    timezone: Mapped[str] = mapped_column(String(64))
    status: Mapped[RunStatus] = mapped_column(pg_enum(RunStatus, "scheduled_run_status"))
    finalize: Mapped[bool]
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    customers: Mapped[int] = mapped_column(Integer, default=0)
    counts: Mapped[dict[str, int]] = mapped_column(JSONB, default=dict)
    failures: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict)  # customer id -> why
    error: Mapped[str | None] = mapped_column(String(2000))
    finished_at: Mapped[datetime | None]
