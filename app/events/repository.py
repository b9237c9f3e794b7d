from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.events.models import DomainEvent


def events_after(
    session: Session,
    *,
    after: int,
    limit: int,
    types: Sequence[str] = (),
    since: datetime | None = None,
    until: datetime | None = None,
    customer_id: uuid.UUID | None = None,
) -> Sequence[DomainEvent]:
    """Up to ``limit`` events with ``seq`` above ``after``, oldest first, filtered."""
    query = select(DomainEvent).where(DomainEvent.seq > after)
    if types:
        query = query.where(DomainEvent.type.in_(types))
    if since is not None:
        query = query.where(DomainEvent.occurred_at >= since)
    if until is not None:
        query = query.where(DomainEvent.occurred_at < until)
    if customer_id is not None:
        query = query.where(DomainEvent.customer_id == customer_id)
    return session.scalars(query.order_by(DomainEvent.seq).limit(limit)).all()


def event_by_id(session: Session, event_id: uuid.UUID) -> DomainEvent | None:
    return session.scalars(select(DomainEvent).where(DomainEvent.id == event_id)).first()
