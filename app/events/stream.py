"""The optional event stream: every event also published to NATS JetStream (``nats-py``).

Off unless ``GPUMETER_NATS_URL`` is set. Each event becomes one job in the event's own
transaction; the job's lock is the event's subject, so one aggregate's events are published in
the order they happened (the queue runs jobs of one lock one at a time, oldest first), while
different aggregates go in parallel. JetStream drops duplicates by ``Nats-Msg-Id`` (the event
id), so a re-run after a crash publishes nothing twice within the stream's duplicate window.
Subject: ``<GPUMETER_NATS_SUBJECT_PREFIX>.<event type>``; the stream is created if missing.
"""

from __future__ import annotations

import asyncio
import uuid

import nats
import procrastinate
from procrastinate import job_context
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from app.core.db import transaction
from app.core.queue import defer
from app.events.models import DomainEvent
from app.events.schemas import EventRead
from app.settings import Settings

tasks = procrastinate.Blueprint()
RETRY = procrastinate.RetryStrategy(max_attempts=50, exponential_wait=2)  # ~12 days in all


def subject_of(settings: Settings, event_type: str) -> str:
    return f"{settings.nats_subject_prefix}.{event_type}"


def queue_publication(session: Session, event: DomainEvent) -> None:
    """Subscriber for every event (registered only when NATS is configured)."""
    defer(session, publish_to_nats, lock=f"nats:{event.subject}", event_id=str(event.id))


def _message(engine: Engine, event_id: str) -> tuple[str, bytes]:
    with transaction(engine) as session:
        event = session.query(DomainEvent).filter(DomainEvent.id == uuid.UUID(event_id)).one()
        return event.type, EventRead.model_validate(event).model_dump_json().encode()


@tasks.task(name="publish", pass_context=True, retry=RETRY)
async def publish_to_nats(context: job_context.JobContext, event_id: str) -> None:
    settings: Settings = context.additional_context["settings"]
    assert settings.nats_url, "NATS publications are only queued when GPUMETER_NATS_URL is set"
    event_type, body = await asyncio.to_thread(
        _message, context.additional_context["engine"], event_id
    )
    client = await nats.connect(
        settings.nats_url, connect_timeout=5, allow_reconnect=False, max_reconnect_attempts=0
    )
    try:
        stream = client.jetstream(timeout=10)
        await stream.add_stream(
            name=settings.nats_stream, subjects=[f"{settings.nats_subject_prefix}.>"]
        )
        await stream.publish(
            subject_of(settings, event_type), body, headers={"Nats-Msg-Id": event_id}
        )
    finally:
        await client.close()
