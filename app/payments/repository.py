from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import Select, or_, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from app.core.pagination import where_given
from app.payments.models import PaymentFailure, StripeOutbox, StripeWebhookEvent, SyncState


def claim_due(session: Session, now: datetime) -> StripeOutbox | None:
    """The oldest due, unleased outbox row, locked; rows other workers hold are skipped."""
    query = (
        select(StripeOutbox)
        .where(
            StripeOutbox.state == SyncState.PENDING,
            StripeOutbox.next_attempt_at <= now,
            or_(StripeOutbox.leased_until.is_(None), StripeOutbox.leased_until < now),
        )
        .order_by(StripeOutbox.next_attempt_at, StripeOutbox.id)
        .limit(1)
        .with_for_update(skip_locked=True)
    )
    return session.scalars(query).first()


def leased_item(session: Session, outbox_id: int, owner: str) -> StripeOutbox | None:
    """The row, locked, if ``owner`` still holds its lease."""
    query = (
        select(StripeOutbox)
        .where(StripeOutbox.id == outbox_id, StripeOutbox.lease_owner == owner)
        .with_for_update()
    )
    return session.scalars(query).first()


def outbox_for_invoice(session: Session, invoice_id: uuid.UUID) -> StripeOutbox | None:
    query = select(StripeOutbox).where(StripeOutbox.invoice_id == invoice_id).with_for_update()
    return session.scalars(query).first()


def outbox_query(
    *, state: SyncState | None = None, customer_id: uuid.UUID | None = None
) -> Select[StripeOutbox]:
    query = select(StripeOutbox).order_by(StripeOutbox.id)
    if state is not None:
        query = query.where(StripeOutbox.state == state)
    if customer_id is not None:
        query = query.where(StripeOutbox.customer_id == customer_id)
    return query


def insert_event(session: Session, event_id: str, type_: str, payload: dict[str, Any]) -> bool:
    """Store the event unless its id is already in the inbox; True when it is new."""
    statement = (
        insert(StripeWebhookEvent)
        .values(id=event_id, type=type_, payload=payload, outcome="received")
        .on_conflict_do_nothing(index_elements=["id"])
        .returning(StripeWebhookEvent.id)
    )
    return session.execute(statement).first() is not None


def payment_failures_query(
    *, customer_id: uuid.UUID | None = None, invoice_id: uuid.UUID | None = None
) -> Select[PaymentFailure]:
    query = select(PaymentFailure).order_by(PaymentFailure.occurred_at, PaymentFailure.id)
    return where_given(
        query,
        (PaymentFailure.customer_id, customer_id),
        (PaymentFailure.invoice_id, invoice_id),
    )
