from __future__ import annotations

import uuid
from datetime import datetime
from decimal import Decimal
from enum import StrEnum

from pydantic import Field

from app.billing.schemas import money
from app.budgets.models import Budget
from app.core.schemas import Amount, Schema


class Basis(StrEnum):
    ACTUAL = "actual"  # cost to date
    FORECAST = "forecast"  # month-end forecast


class Threshold(Schema):
    percent: int = Field(ge=1, le=1000, description="Percent of the budget's amount.")
    basis: Basis = Basis.ACTUAL


DEFAULT_THRESHOLDS = [
    Threshold(percent=50),
    Threshold(percent=80),
    Threshold(percent=100),
    Threshold(percent=100, basis=Basis.FORECAST),
]


class BudgetCreate(Schema):
    amount: Amount = Field(description="Per billing month, in the customer's currency.")
    rental_id: uuid.UUID | None = Field(default=None, description="Unset: the whole customer.")
    thresholds: list[Threshold] = Field(
        default_factory=lambda: list(DEFAULT_THRESHOLDS), min_length=1, max_length=20
    )
    hard_limit: bool = Field(
        default=False, description="Refuse new rentals once the month's spend reaches it."
    )


class BudgetUpdate(Schema):
    """A change of amount, thresholds or hard limit (a budget's scope stays: delete it and
    create another); unset fields keep their value."""

    amount: Amount | None = Field(default=None, description="Per billing month.")
    thresholds: list[Threshold] | None = Field(default=None, min_length=1, max_length=20)
    hard_limit: bool | None = None


class BudgetRead(Schema):
    id: uuid.UUID
    customer_id: uuid.UUID
    rental_id: uuid.UUID | None
    amount: str
    currency: str
    thresholds: list[Threshold]
    hard_limit: bool
    created_at: datetime

    @classmethod
    def of(cls, budget: Budget) -> BudgetRead:
        return cls(
            id=budget.id,
            customer_id=budget.customer_id,
            rental_id=budget.rental_id,
            amount=money(budget.amount, budget.currency),
            currency=budget.currency,
            thresholds=[Threshold.model_validate(t) for t in budget.thresholds],
            hard_limit=budget.hard_limit,
            created_at=budget.created_at,
        )


class ThresholdStatus(Threshold):
    at: str = Field(description="The spend at which it is crossed.")
    crossed: bool


class BudgetStatus(Schema):
    budget: BudgetRead
    period: str
    spend: str = Field(description="Cost to date (before vouchers and tax).")
    forecast: str
    used_percent: Decimal = Field(description="Spend as a percent of the amount, 1 decimal.")
    thresholds: list[ThresholdStatus]
    blocks_new_rentals: bool
    forecast_assumes: str = Field(description="What the forecast takes for granted.")


class CheckRead(Schema):
    period_by_customer: dict[uuid.UUID, str]
    crossed: int = Field(description="Thresholds newly crossed (one event each).")
