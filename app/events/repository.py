from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import Select, select
from sqlalchemy.orm import Session

from app.auth.service import Principal
from app.auth.tenancy import readable_by
from app.events.models import DomainEvent


def readable_events(principal: Principal) -> Select[DomainEvent]:
    """Every event the principal may read: all for an admin, its customer's for a customer
    key (events without a customer are the operator's); every list of events starts here."""
    return select(DomainEvent).where(readable_by(principal, DomainEvent.customer_id))


def events_after(
    session: Session,
    readable: Select[DomainEvent],
    *,
    after: int,
    limit: int,
    types: Sequence[str] = (),
    since: datetime | None = None,
    until: datetime | None = None,
) -> Sequence[DomainEvent]:
    """Up to ``limit`` of the ``readable`` events with ``seq`` above ``after``, oldest first,
    filtered."""
    query = readable.where(DomainEvent.seq > after)
    if types:
        query = query.where(DomainEvent.type.in_(types))
    if since is not None:
        query = query.where(DomainEvent.occurred_at >= since)
    if until is not None:
        query = query.where(DomainEvent.occurred_at < until)
    return session.scalars(query.order_by(DomainEvent.seq).limit(limit)).all()


def event_by_id(session: Session, event_id: uuid.UUID) -> DomainEvent | None:
    return session.scalars(select(DomainEvent).where(DomainEvent.id == event_id)).first()


def event_types(session: Session, event_ids: list[uuid.UUID]) -> dict[uuid.UUID, str]:
    rows = session.execute(
        select(DomainEvent.id, DomainEvent.type).where(DomainEvent.id.in_(event_ids))
    )
    return {event_id: type_ for event_id, type_ in rows}
