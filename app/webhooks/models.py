"""Webhook endpoints, one delivery per (event, endpoint), and every attempt of a delivery.

Signing needs the secret itself (Standard Webhooks signatures are HMACs), so it is kept
encrypted, not hashed: a Fernet token under the configured keys (``app.core.crypto``). After a
rotation the previous secret signs too, until ``previous_secret_expires_at``, so receivers can
switch without dropping a delivery.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from enum import StrEnum

from sqlalchemy import ForeignKey, Index, Integer, String, UniqueConstraint, func, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Mapped, mapped_column

from app.core.base import Base, Timestamped, pg_enum
from app.core.crypto import EncryptedString

# A Fernet token of a ``whsec_`` secret (51 characters) is 164 characters; room to spare.
SECRET_TOKEN_LENGTH = 300


class DeliveryStatus(StrEnum):
    PENDING = "pending"  # a job will (re)try it at next_attempt_at
    SUCCEEDED = "succeeded"  # the endpoint answered 2xx
    FAILED = "failed"  # retried for the whole retry window, or the endpoint was disabled


class WebhookEndpoint(Timestamped, Base):
    __tablename__ = "webhook_endpoints"

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    url: Mapped[str] = mapped_column(String(2000))
    description: Mapped[str | None] = mapped_column(String(500))
    event_types: Mapped[list[str]] = mapped_column(ARRAY(String(100)))  # empty: every type
    customer_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("customers.id"), index=True)
    enabled: Mapped[bool]
    secret: Mapped[str] = mapped_column(EncryptedString(SECRET_TOKEN_LENGTH))
    previous_secret: Mapped[str | None] = mapped_column(EncryptedString(SECRET_TOKEN_LENGTH))
    previous_secret_expires_at: Mapped[datetime | None]
    failure_streak: Mapped[int] = mapped_column(Integer, default=0)  # failed attempts in a row
    failing_since: Mapped[datetime | None]  # the first failure of the streak
    disabled_reason: Mapped[str | None] = mapped_column(String(500))
    updated_at: Mapped[datetime] = mapped_column(server_default=func.now(), onupdate=func.now())


class WebhookDelivery(Timestamped, Base):
    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        UniqueConstraint("endpoint_id", "event_id"),
        Index("ix_webhook_deliveries_endpoint_id_id", "endpoint_id", "id"),
        Index(
            "ix_webhook_deliveries_pending", "status", postgresql_where=text("status = 'pending'")
        ),
    )

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    endpoint_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("webhook_endpoints.id"))
    event_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("events.id"), index=True)
    status: Mapped[DeliveryStatus] = mapped_column(
        pg_enum(DeliveryStatus, "webhook_delivery_status"), default=DeliveryStatus.PENDING
    )
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    retrying_since: Mapped[datetime] = mapped_column(server_default=func.now())  # window start
    next_attempt_at: Mapped[datetime | None] = mapped_column(server_default=func.now())
    last_status_code: Mapped[int | None] = mapped_column(Integer)
    last_error: Mapped[str | None] = mapped_column(String(500))
    delivered_at: Mapped[datetime | None]


class WebhookAttempt(Base):
    """One HTTP request of a delivery: the delivery log."""

    __tablename__ = "webhook_attempts"

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    delivery_id: Mapped[int] = mapped_column(ForeignKey("webhook_deliveries.id"), index=True)
    number: Mapped[int] = mapped_column(Integer)  # 1 for the first attempt of the delivery
    at: Mapped[datetime]
    status_code: Mapped[int | None] = mapped_column(Integer)  # None: no HTTP answer
    error: Mapped[str | None] = mapped_column(String(500))
    duration_ms: Mapped[int] = mapped_column(Integer)
