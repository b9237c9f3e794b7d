"""The reservation's expiry: a job scheduled, in the reserving transaction, for the moment the
reservation lapses; it releases the spare unless the failover was answered meanwhile."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import procrastinate
from procrastinate import job_context
from sqlalchemy.orm import Session

from app.core.db import transaction
from app.core.queue import defer
from app.failover.transitions import expire

tasks = procrastinate.Blueprint()


@tasks.task(name="expire", pass_context=True)
def expire_reservation(context: job_context.JobContext, failover_id: str) -> bool:
    """Whether the reservation expired now (False: answered meanwhile, or not yet due)."""
    engine, settings = context.additional_context["engine"], context.additional_context["settings"]
    with transaction(engine) as session:
        now, target = datetime.now(UTC), settings.spare_target_percent
        return expire(session, uuid.UUID(failover_id), now, target) is not None


def schedule_expiry(session: Session, failover_id: uuid.UUID, at: datetime) -> None:
    """Have the reservation checked at ``at``, once this transaction commits."""
    lock = f"failover:{failover_id}"
    defer(session, expire_reservation, lock=lock, schedule_at=at, failover_id=str(failover_id))
