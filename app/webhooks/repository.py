from __future__ import annotations

import uuid
from collections.abc import Sequence

from sqlalchemy import Select, or_, select
from sqlalchemy.orm import Session

from app.events.models import DomainEvent
from app.webhooks.models import DeliveryStatus, WebhookAttempt, WebhookDelivery, WebhookEndpoint


def endpoints_for(session: Session, event: DomainEvent) -> Sequence[WebhookEndpoint]:
    """Enabled endpoints that want ``event``: its type (or every type), and its customer's
    (or every customer's)."""
    query = select(WebhookEndpoint).where(
        WebhookEndpoint.enabled,
        or_(WebhookEndpoint.event_types == [], WebhookEndpoint.event_types.contains([event.type])),
        or_(
            WebhookEndpoint.customer_id.is_(None),
            WebhookEndpoint.customer_id == event.customer_id,
        ),
    )
    return session.scalars(query.order_by(WebhookEndpoint.id)).all()


def endpoints_query() -> Select[WebhookEndpoint]:
    return select(WebhookEndpoint).order_by(WebhookEndpoint.created_at, WebhookEndpoint.id)


def deliveries_query(
    endpoint_id: uuid.UUID, status: DeliveryStatus | None
) -> Select[WebhookDelivery]:
    query = select(WebhookDelivery).where(WebhookDelivery.endpoint_id == endpoint_id)
    if status is not None:
        query = query.where(WebhookDelivery.status == status)
    return query.order_by(WebhookDelivery.id.desc())


def locked_delivery(session: Session, delivery_id: int) -> WebhookDelivery | None:
    return session.get(WebhookDelivery, delivery_id, with_for_update=True)


def attempts_of(session: Session, delivery_ids: list[int]) -> dict[int, list[WebhookAttempt]]:
    rows = session.scalars(
        select(WebhookAttempt)
        .where(WebhookAttempt.delivery_id.in_(delivery_ids))
        .order_by(WebhookAttempt.delivery_id, WebhookAttempt.number)
    )
    out: dict[int, list[WebhookAttempt]] = {i: [] for i in delivery_ids}
    for row in rows:
        out[row.delivery_id].append(row)
    return out
