"""The delivery job: one attempt of one delivery, and the next one scheduled if it failed.

Its lock (per delivery) keeps two workers from delivering one event to one endpoint at once;
a worker killed mid-attempt leaves the job ``doing`` until ``retry_stalled`` re-queues it.
"""

from __future__ import annotations

from datetime import datetime

import procrastinate
from procrastinate import job_context
from sqlalchemy.orm import Session

from app.core.db import transaction
from app.core.queue import defer
from app.webhooks import delivery

tasks = procrastinate.Blueprint()


@tasks.task(name="deliver", pass_context=True)
def deliver(context: job_context.JobContext, delivery_id: int, attempt: int) -> None:
    engine = context.additional_context["engine"]
    settings = context.additional_context["settings"]
    with transaction(engine) as session:
        request = delivery.prepare(session, delivery_id, attempt)
    if request is None:
        return
    outcome = delivery.send(request, settings)
    with transaction(engine) as session:
        retry_at = delivery.record(session, delivery_id, attempt, outcome, settings)
        if retry_at is not None:
            schedule(session, delivery_id, attempt + 1, retry_at)


def schedule(session: Session, delivery_id: int, attempt: int, at: datetime | None) -> None:
    """Have attempt ``attempt`` of the delivery made at ``at`` (None: now), once this
    transaction commits."""
    lock = f"webhook-delivery:{delivery_id}"
    defer(session, deliver, lock=lock, schedule_at=at, delivery_id=delivery_id, attempt=attempt)
