from __future__ import annotations

import uuid
from datetime import datetime
from decimal import Decimal
from typing import Annotated

from pydantic import Field, field_validator

from app.core.schemas import (
    Amount,
    CurrencyCode,
    HourlyPrice,
    Instant,
    Name,
    Schema,
    not_null,
)
from app.metering.causes import DEGRADED_CAUSES, DegradedCause


class VoucherTier(Schema):
    min_days: int = Field(ge=1, le=3660, description="Continuous rental days needed.")
    percent: Annotated[Decimal, Field(gt=0, le=100, decimal_places=4)]


class PriceCreate(Schema):
    gpu_model: str = Field(min_length=1, max_length=100)
    price_per_hour: HourlyPrice
    monthly_cap_per_gpu: Amount | None = Field(
        default=None,
        description="The most a rental pays per GPU for a whole month at this price (e.g. the "
        "reserved price), prorated by its billed GPU-seconds; effective with the price.",
    )
    preemptible_price_per_hour: HourlyPrice | None = Field(
        default=None,
        description="Hourly price of a preemptible rental (a hot spare a failover may preempt); "
        "without it the model cannot be rented preemptibly at this price's time.",
    )
    effective_from: Instant
    customer_id: uuid.UUID | None = Field(
        default=None, description="Set for a customer's contract price (an override)."
    )


class PriceRead(Schema):
    id: int
    gpu_model: str
    price_per_hour: Decimal
    monthly_cap_per_gpu: Decimal | None
    preemptible_price_per_hour: Decimal | None
    effective_from: datetime
    customer_id: uuid.UUID | None


def _distinct_tiers(tiers: list[VoucherTier]) -> list[VoucherTier]:
    days = [tier.min_days for tier in tiers]
    if len(set(days)) != len(days):
        raise ValueError("voucher tiers must have distinct min_days")
    return sorted(tiers, key=lambda tier: tier.min_days)


_CREDIT_STALL = (
    "When a rented GPU fails, credit the rental's other GPUs (stall_credit) from the failure "
    "second until the job runs again on a spare, the GPU is repaired, or the rental ends."
)
_DEGRADED_AFTER = (
    "Spare policy: fail a rented GPU over to a spare once it has been degraded this many "
    "seconds by one of migrate_degraded_causes (null: never). The migration window is credited "
    "as migration; the degraded seconds before it follow bill_degraded."
)
DegradedCauses = Annotated[
    list[DegradedCause],
    Field(max_length=len(DEGRADED_CAUSES), description="Degraded causes that migrate."),
]


def _distinct_causes(causes: list[DegradedCause] | None) -> list[DegradedCause] | None:
    return None if causes is None else sorted(set(causes))


class PlanSettings(Schema):
    increment_s: int = Field(default=1, ge=1, le=86_400, description="Billing increment.")
    minimum_s: int = Field(default=1, ge=0, le=31 * 86_400, description="Minimum per session.")
    bill_degraded: bool = True
    bill_unmetered: bool = False
    credit_stall: bool = Field(default=True, description=_CREDIT_STALL)
    migrate_degraded_after_s: int | None = Field(
        default=None, ge=1, le=86_400, description=_DEGRADED_AFTER
    )
    migrate_degraded_causes: DegradedCauses = Field(default_factory=list)
    voucher_tiers: list[VoucherTier] = Field(default_factory=list, max_length=20)
    voucher_validity_days: int = Field(default=90, ge=1, le=3660)

    _tiers = field_validator("voucher_tiers")(_distinct_tiers)
    _causes = field_validator("migrate_degraded_causes")(_distinct_causes)


class PlanCreate(PlanSettings):
    name: Name
    currency: CurrencyCode = "USD"
    prices: list[PriceCreate] = Field(default_factory=list, max_length=500)


class PlanUpdate(Schema):
    """A partial update: fields left out stay; only the cap may be cleared with null."""

    name: Name | None = None
    increment_s: int | None = Field(default=None, ge=1, le=86_400)
    minimum_s: int | None = Field(default=None, ge=0, le=31 * 86_400)
    bill_degraded: bool | None = None
    bill_unmetered: bool | None = None
    credit_stall: bool | None = Field(default=None, description=_CREDIT_STALL)
    migrate_degraded_after_s: int | None = Field(
        default=None, ge=1, le=86_400, description=f"{_DEGRADED_AFTER} Null turns it off."
    )
    migrate_degraded_causes: DegradedCauses | None = None
    voucher_tiers: list[VoucherTier] | None = Field(default=None, max_length=20)
    voucher_validity_days: int | None = Field(default=None, ge=1, le=3660)

    _tiers = field_validator("voucher_tiers")(
        lambda tiers: None if tiers is None else _distinct_tiers(tiers)
    )
    _causes = field_validator("migrate_degraded_causes")(_distinct_causes)
    _not_null = not_null(
        "name",
        "increment_s",
        "minimum_s",
        "bill_degraded",
        "bill_unmetered",
        "credit_stall",
        "migrate_degraded_causes",
        "voucher_tiers",
        "voucher_validity_days",
    )


class PlanRead(Schema):
    id: uuid.UUID
    name: str
    currency: str
    increment_s: int
    minimum_s: int
    bill_degraded: bool
    bill_unmetered: bool
    credit_stall: bool
    migrate_degraded_after_s: int | None
    migrate_degraded_causes: list[DegradedCause]
    voucher_tiers: list[VoucherTier]
    voucher_validity_days: int
    prices: list[PriceRead]
    created_at: datetime
