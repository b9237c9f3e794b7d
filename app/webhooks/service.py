"""Webhook endpoints (admin API) and the subscriber that turns events into deliveries."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from sqlalchemy import func
from sqlalchemy.orm import Session

from app.core.errors import Conflict, Unprocessable, not_found
from app.customers.service import customer_by_id
from app.events import service as events_service
from app.events.models import DomainEvent
from app.webhooks import jobs, repository
from app.webhooks.models import DeliveryStatus, WebhookAttempt, WebhookDelivery, WebhookEndpoint
from app.webhooks.schemas import (
    AttemptRead,
    DeliveryRead,
    EndpointCreate,
    EndpointUpdate,
    EndpointWithSecret,
)
from app.webhooks.signing import new_secret
from app.webhooks.targets import RefusedTarget, check_target

ROTATION_OVERLAP = timedelta(hours=24)  # the previous secret keeps signing this long


def on_event(session: Session, event: DomainEvent) -> None:
    """Every event: one delivery per endpoint that wants it, queued in the event's transaction."""
    for endpoint in repository.endpoints_for(session, event):
        row = WebhookDelivery(endpoint_id=endpoint.id, event_id=event.id)
        session.add(row)
        session.flush()
        jobs.schedule(session, row.id, 0, None)


def _checked_url(url: str, allow_private: bool) -> str:
    try:
        check_target(url, allow_private=allow_private)
    except RefusedTarget as refused:
        raise Unprocessable(str(refused), ("body", "url")) from None
    return url


def create_endpoint(
    session: Session, data: EndpointCreate, allow_private: bool
) -> EndpointWithSecret:
    """Register an endpoint; ``allow_private`` (the ``webhook_allow_private`` setting) admits
    private and loopback targets."""
    if data.customer_id is not None and customer_by_id(session, data.customer_id) is None:
        raise Unprocessable(f"customer {data.customer_id} does not exist", ("body", "customer_id"))
    endpoint = WebhookEndpoint(
        url=_checked_url(str(data.url), allow_private),
        event_types=sorted(set(data.event_types)),
        customer_id=data.customer_id,
        enabled=data.enabled,
        description=data.description,
        secret=new_secret(),
        failure_streak=0,
    )
    session.add(endpoint)
    session.flush()
    session.refresh(endpoint)
    return EndpointWithSecret.model_validate(endpoint)


def get_endpoint(
    session: Session, endpoint_id: uuid.UUID, *, lock: bool = False
) -> WebhookEndpoint:
    endpoint = session.get(WebhookEndpoint, endpoint_id, with_for_update=lock)
    if endpoint is None:
        raise not_found("webhook endpoint", endpoint_id)
    return endpoint


def update_endpoint(
    session: Session, endpoint_id: uuid.UUID, data: EndpointUpdate, allow_private: bool
) -> WebhookEndpoint:
    endpoint = get_endpoint(session, endpoint_id, lock=True)
    if data.url is not None:
        endpoint.url = _checked_url(str(data.url), allow_private)
    if data.event_types is not None:
        endpoint.event_types = sorted(set(data.event_types))
    if data.description is not None:
        endpoint.description = data.description
    if data.enabled is not None:
        if data.enabled and not endpoint.enabled:  # a fresh start
            endpoint.failure_streak, endpoint.failing_since = 0, None
            endpoint.disabled_reason = None
        endpoint.enabled = data.enabled
    session.flush()
    session.refresh(endpoint)
    return endpoint


def rotate_secret(session: Session, endpoint_id: uuid.UUID) -> EndpointWithSecret:
    """A new secret; the old one signs too for ``ROTATION_OVERLAP``, so no delivery fails
    verification while the receiver switches."""
    endpoint = get_endpoint(session, endpoint_id, lock=True)
    endpoint.previous_secret = endpoint.secret
    endpoint.previous_secret_expires_at = datetime.now(UTC) + ROTATION_OVERLAP
    endpoint.secret = new_secret()
    session.flush()
    session.refresh(endpoint)
    return EndpointWithSecret.model_validate(endpoint)


def resend(session: Session, delivery_id: int) -> DeliveryRead:
    """Deliver again now, with a fresh retry window (same event, so the same webhook-id)."""
    delivery = repository.locked_delivery(session, delivery_id)
    if delivery is None:
        raise not_found("webhook delivery", delivery_id)
    if not get_endpoint(session, delivery.endpoint_id).enabled:
        raise Conflict("the endpoint is disabled; enable it first", ("path", "delivery_id"))
    delivery.status = DeliveryStatus.PENDING
    delivery.retrying_since = delivery.next_attempt_at = func.now()
    session.flush()
    jobs.schedule(session, delivery.id, delivery.attempts, None)
    session.refresh(delivery)
    return delivery_views(session, [delivery])[0]


def delivery_views(session: Session, deliveries: list[WebhookDelivery]) -> list[DeliveryRead]:
    ids = [d.id for d in deliveries]
    log = repository.attempts_of(session, ids)
    types = events_service.event_types(session, [d.event_id for d in deliveries])
    return [_delivery_read(d, types[d.event_id], log[d.id]) for d in deliveries]


def _delivery_read(
    delivery: WebhookDelivery, event_type: str, attempts: list[WebhookAttempt]
) -> DeliveryRead:
    return DeliveryRead(
        id=delivery.id,
        endpoint_id=delivery.endpoint_id,
        event_id=delivery.event_id,
        event_type=event_type,
        status=delivery.status,
        attempts=delivery.attempts,
        next_attempt_at=delivery.next_attempt_at,
        last_status_code=delivery.last_status_code,
        last_error=delivery.last_error,
        delivered_at=delivery.delivered_at,
        created_at=delivery.created_at,
        log=[AttemptRead.model_validate(a) for a in attempts],
    )
