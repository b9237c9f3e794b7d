"""The Stripe mirror's tables: the sync outbox, the webhook inbox and payment failures.

The outbox row of an invoice is written in the transaction that finalizes (or voids) it, so
no finalization is ever lost to a Stripe outage; the worker drains it later. The inbox stores
every webhook event once, by Stripe's event id, which makes duplicate deliveries no-ops.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from decimal import Decimal
from enum import StrEnum
from typing import Any

from sqlalchemy import ForeignKey, Index, Integer, String, func, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from app.core.base import Base, Timestamped, pg_enum


class SyncTarget(StrEnum):
    """What the Stripe invoice must end up as."""

    FINALIZED = "finalized"
    VOID = "void"


class SyncState(StrEnum):
    PENDING = "pending"  # the worker will (re)try it at next_attempt_at
    SYNCED = "synced"  # Stripe shows the target
    FAILED = "failed"  # stopped on an error a retry cannot fix; an admin retries it


class SyncStep(StrEnum):
    """The last step completed, so a resumed sync starts after it."""

    QUEUED = "queued"
    CUSTOMER = "customer"
    INVOICE = "invoice"
    ITEMS = "items"
    FINALIZED = "finalized"
    VOIDED = "voided"


class StripeOutbox(Timestamped, Base):
    """One row per invoice that Stripe must mirror; the unit a worker claims and leases."""

    __tablename__ = "stripe_outbox"
    __table_args__ = (
        Index(
            "ix_stripe_outbox_due",
            "next_attempt_at",
            postgresql_where=text("state = 'pending'"),
        ),
    )

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    invoice_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("invoices.id"), unique=True)
    customer_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("customers.id"), index=True)
    target: Mapped[SyncTarget] = mapped_column(pg_enum(SyncTarget, "stripe_sync_target"))
    state: Mapped[SyncState] = mapped_column(
        pg_enum(SyncState, "stripe_sync_state"), default=SyncState.PENDING
    )
    step: Mapped[SyncStep] = mapped_column(
        pg_enum(SyncStep, "stripe_sync_step"), default=SyncStep.QUEUED
    )
    items_created: Mapped[int] = mapped_column(Integer, default=0)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime] = mapped_column(server_default=func.now())
    lease_owner: Mapped[str | None] = mapped_column(String(64))
    leased_until: Mapped[datetime | None]
    last_error: Mapped[str | None] = mapped_column(String(2000))
    updated_at: Mapped[datetime] = mapped_column(server_default=func.now(), onupdate=func.now())
    synced_at: Mapped[datetime | None]


class StripeWebhookEvent(Base):
    """The webhook inbox: each Stripe event, once, with what handling it did."""

    __tablename__ = "stripe_webhook_events"

    id: Mapped[str] = mapped_column(String(255), primary_key=True)  # Stripe's evt_... id
    type: Mapped[str] = mapped_column(String(100))
    stripe_object_id: Mapped[str | None] = mapped_column(String(255))
    invoice_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("invoices.id"), index=True)
    payload: Mapped[dict[str, Any]] = mapped_column(JSONB)
    outcome: Mapped[str] = mapped_column(
        String(32)
    )  # applied | ignored | unknown_invoice | unknown_customer | wrong_currency | mismatch
    received_at: Mapped[datetime] = mapped_column(server_default=func.now())


class PaymentFailure(Base):
    """A failed payment attempt Stripe reported (``invoice.payment_failed``)."""

    __tablename__ = "stripe_payment_failures"

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    event_id: Mapped[str] = mapped_column(ForeignKey("stripe_webhook_events.id"), unique=True)
    invoice_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("invoices.id"), index=True)
    customer_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("customers.id"), index=True)
    stripe_invoice_id: Mapped[str] = mapped_column(String(255))
    amount_due: Mapped[Decimal]
    currency: Mapped[str] = mapped_column(String(3))
    attempt_count: Mapped[int] = mapped_column(Integer)
    next_payment_attempt: Mapped[datetime | None]
    occurred_at: Mapped[datetime]
