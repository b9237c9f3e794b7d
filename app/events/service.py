"""Publishing domain events, and the in-process subscribers that react to them.

``publish`` writes the event in the caller's transaction (the outbox), then runs the
subscribers of its type in that same transaction: what they write (a Stripe sync, webhook
deliveries) commits or rolls back with the change itself, so no event is lost or invented.
Subscribers are registered by the composition root (``app.wiring``), never on import, so a
domain package only knows the event it publishes, not who listens.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from pydantic_core import to_jsonable_python
from sqlalchemy.orm import Session

from app.auth.service import Principal
from app.core.errors import BIGINT_MAX, Unprocessable
from app.events import repository
from app.events.models import DomainEvent
from app.events.schemas import EventPage, EventRead

PAYLOAD_VERSION = 1
ALL_TYPES = "*"  # subscribe to every event type
_TYPE = re.compile(r"^[a-z][a-z_]*(\.[a-z][a-z_]*)+$")

Subscriber = Callable[[Session, DomainEvent], None]
_subscribers: dict[str, list[Subscriber]] = {}


def subscribe(event_type: str, subscriber: Subscriber) -> None:
    """React to ``event_type`` (or ``ALL_TYPES``) in the publishing transaction; idempotent."""
    handlers = _subscribers.setdefault(event_type, [])
    if subscriber not in handlers:
        handlers.append(subscriber)


def unsubscribe(event_type: str, subscriber: Subscriber) -> None:
    _subscribers.get(event_type, []).remove(subscriber)


def publish(
    session: Session,
    type: str,
    data: dict[str, Any],
    *,
    subject: str,
    customer_id: uuid.UUID | None = None,
) -> DomainEvent:
    """Write event ``type`` about ``subject`` (the aggregate, e.g. ``invoice/<id>``) in the
    caller's transaction and let its subscribers react there. ``data`` is made JSON here:
    Decimals become strings (money is never a float), UUIDs and times strings too."""
    if not _TYPE.match(type):
        raise ValueError(f"event type {type!r} is not like 'invoice.finalized'")
    event = DomainEvent(
        id=uuid.uuid4(),
        type=type,
        occurred_at=datetime.now(UTC),
        subject=subject,
        customer_id=customer_id,
        version=PAYLOAD_VERSION,
        data=to_jsonable_python(data),
    )
    session.add(event)
    session.flush()
    for subscriber in [*_subscribers.get(type, []), *_subscribers.get(ALL_TYPES, [])]:
        subscriber(session, event)
    return event


def get_event(session: Session, event_id: uuid.UUID) -> DomainEvent:
    event = repository.event_by_id(session, event_id)
    if event is None:
        raise LookupError(f"event {event_id} does not exist")
    return event


def event_types(session: Session, event_ids: list[uuid.UUID]) -> dict[uuid.UUID, str]:
    """Read interface (webhook deliveries): each event's type."""
    return repository.event_types(session, event_ids)


def _cursor(after: str | None) -> int:
    """The event id a cursor (decimal digits, by the endpoint's pattern) stands for; none: 0,
    from the start. Past a BIGINT it is no id of ours: 422, not a query the database refuses."""
    cursor = int(after) if after else 0
    if cursor > BIGINT_MAX:
        raise Unprocessable(f"cursor {after!r} is not one this API returned", ("query", "after"))
    return cursor


def list_events(
    session: Session,
    principal: Principal,
    *,
    after: str | None,
    limit: int,
    types: list[str],
    since: datetime | None,
    until: datetime | None,
) -> EventPage:
    """A page of the events the caller may see: all for admins, a customer's own otherwise."""
    cursor = _cursor(after)
    if since and until and since >= until:
        raise Unprocessable("since must be before until", ("query", "since"))
    rows = repository.events_after(
        session,
        repository.readable_events(principal),
        after=cursor,
        limit=limit + 1,
        types=types,
        since=since,
        until=until,
    )
    page = rows[:limit]  # the repository reads one extra row to tell whether more follow
    return EventPage(
        items=[EventRead.model_validate(row) for row in page],
        limit=limit,
        next_cursor=str(page[-1].seq if page else cursor),
        has_more=len(rows) > limit,
    )
