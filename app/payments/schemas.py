from __future__ import annotations

import uuid
from datetime import datetime
from decimal import Decimal

from pydantic import field_serializer

from app.billing.schemas import money
from app.core.schemas import Schema
from app.payments.models import SyncState, SyncStep, SyncTarget


class SyncRead(Schema):
    """Where the Stripe mirror of one invoice stands."""

    target: SyncTarget
    state: SyncState
    step: SyncStep
    items_created: int
    attempts: int
    next_attempt_at: datetime
    last_error: str | None
    updated_at: datetime
    synced_at: datetime | None


class OutboxRead(SyncRead):
    invoice_id: uuid.UUID
    customer_id: uuid.UUID


class PaymentFailureRead(Schema):
    id: int
    stripe_invoice_id: str
    amount_due: Decimal
    currency: str
    attempt_count: int
    next_payment_attempt: datetime | None
    occurred_at: datetime

    @field_serializer("amount_due")
    def _in_minor_units(self, amount: Decimal) -> str:
        return money(amount, self.currency)  # "70.76", as on the invoice


class InvoiceStripeRead(Schema):
    """An invoice as Stripe mirrors it: ids, status, the sync and failed payments."""

    invoice_id: uuid.UUID
    customer_id: uuid.UUID
    stripe_invoice_id: str | None
    stripe_invoice_number: str | None
    stripe_hosted_url: str | None
    stripe_status: str | None
    stripe_error: str | None
    sync: SyncRead | None  # None: never queued (Stripe off, or the invoice is a draft)
    payment_failures: list[PaymentFailureRead]


class WebhookAck(Schema):
    event_id: str
    duplicate: bool
