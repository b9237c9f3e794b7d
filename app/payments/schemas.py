from __future__ import annotations

import uuid
from datetime import datetime
from decimal import Decimal
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_serializer

from app.billing.schemas import money
from app.core.errors import BIGINT_MAX
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


# -- a Stripe event as the webhook reads it ------------------------------------------------------

# The latest time a Stripe timestamp may name (the end of year 9999), so none overflows a date.
_LAST_EPOCH = 253_402_300_799
_Amount = Annotated[int, Field(ge=0, le=BIGINT_MAX)]


class StripeObjectIn(BaseModel):
    """The fields of an event's ``data.object`` the handlers read, typed as Stripe sends them
    (strict: a string is not a number); any others pass unread."""

    model_config = ConfigDict(extra="allow", strict=True)

    id: str | None = Field(default=None, min_length=1, max_length=255)
    object: str | None = None
    metadata: dict[str, str] | None = None
    currency: str | None = None
    livemode: bool | None = None
    amount_received: _Amount = 0
    amount_paid: _Amount | None = None
    amount_due: _Amount = 0
    attempt_count: _Amount = 0
    next_payment_attempt: Annotated[int, Field(ge=0, le=_LAST_EPOCH)] | None = None


class StripeEventData(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    object: StripeObjectIn


class StripeEventIn(BaseModel):
    """A Stripe event's envelope, as the webhook inbox stores it."""

    model_config = ConfigDict(extra="allow", strict=True)

    id: str = Field(min_length=1, max_length=255)
    type: str = Field(min_length=1, max_length=100)
    created: Annotated[int, Field(ge=0, le=_LAST_EPOCH)] | None = None
    data: StripeEventData
