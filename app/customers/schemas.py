from __future__ import annotations

import uuid
from datetime import datetime
from decimal import Decimal
from typing import Annotated, Literal

from pydantic import EmailStr, Field

from app.core.schemas import CurrencyCode, Name, Schema, TimeZoneName, not_null

TaxRate = Annotated[Decimal, Field(ge=0, lt=1, decimal_places=6)]
# Stripe's ids ("cus_..."): never empty, each customer's own (a duplicate is a 409).
StripeCustomerId = Annotated[str, Field(min_length=1, max_length=255, pattern=r"^[A-Za-z0-9_]+$")]
CollectionMethod = Literal["charge_automatically", "send_invoice"]


class CustomerCreate(Schema):
    name: Name
    email: EmailStr | None = None
    currency: CurrencyCode = "USD"
    billing_timezone: TimeZoneName = "UTC"
    tax_rate: TaxRate | None = None
    stripe_customer_id: StripeCustomerId | None = None
    collection_method: CollectionMethod = "send_invoice"
    days_until_due: int = Field(default=30, ge=0, le=365)


class CustomerUpdate(Schema):
    """A partial update: fields left out stay; email, tax rate and Stripe id may be cleared with
    null, the others not."""

    name: Name | None = None
    email: EmailStr | None = None
    currency: CurrencyCode | None = None
    billing_timezone: TimeZoneName | None = None
    tax_rate: TaxRate | None = None
    stripe_customer_id: StripeCustomerId | None = None
    collection_method: CollectionMethod | None = None
    days_until_due: int | None = Field(default=None, ge=0, le=365)
    _not_null = not_null(
        "name", "currency", "billing_timezone", "collection_method", "days_until_due"
    )


class CustomerRead(Schema):
    id: uuid.UUID
    name: str
    email: str | None
    currency: str
    billing_timezone: str
    tax_rate: Decimal | None
    stripe_customer_id: str | None
    collection_method: str
    days_until_due: int
    created_at: datetime
