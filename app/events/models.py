"""The event outbox: one row per domain event, written in the transaction of the change.

``seq`` orders the events for cursor reads (``GET /v1/events``); ``id`` is the event's public,
unique id, used as the idempotency key of every delivery (webhooks, NATS).
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import Identity, Index, Integer, String, func
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from app.core.base import Base


class DomainEvent(Base):
    __tablename__ = "events"
    __table_args__ = (
        Index("ix_events_type_seq", "type", "seq"),
        Index("ix_events_customer_seq", "customer_id", "seq"),
        Index("ix_events_occurred_at", "occurred_at"),
    )

    seq: Mapped[int] = mapped_column(Identity(always=True), primary_key=True)
    id: Mapped[uuid.UUID] = mapped_column(unique=True)
    type: Mapped[str] = mapped_column(String(100))
    occurred_at: Mapped[datetime] = mapped_column(server_default=func.now())
    subject: Mapped[str] = mapped_column(String(200))  # the aggregate: "invoice/<id>", ...
    customer_id: Mapped[uuid.UUID | None]  # whose event it is; None: an operator's only
    version: Mapped[int] = mapped_column(Integer)  # the payload's schema version
    data: Mapped[dict[str, Any]] = mapped_column(JSONB)
