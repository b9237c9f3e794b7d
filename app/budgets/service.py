"""Budgets: thresholds of a monthly amount against actual and forecast spend.

Spend is billing's own usage view (cost to date and month-end forecast, before vouchers and
tax) for the customer's current period, the whole customer's or one rental's. Crossing is
evaluated by ``check`` (``POST /v1/budget-checks``, for a scheduler): each threshold newly at
or over its mark in a period is recorded once and published once as
``budget.threshold_crossed``. Pages and ``status`` only read. A hard limit (whole-customer
budgets) refuses new rentals while the month's spend is at or over the amount.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from decimal import Decimal

from sqlalchemy.orm import Session

from app.auth.service import Principal
from app.billing.loader import current_period
from app.billing.schemas import UsageRead, money
from app.billing.usage import FORECAST_ASSUMES, UsageSettings, usage
from app.budgets import repository
from app.budgets.models import Budget
from app.budgets.schemas import (
    Basis,
    BudgetCreate,
    BudgetRead,
    BudgetStatus,
    BudgetUpdate,
    CheckRead,
    ThresholdStatus,
)
from app.core.db import lock_keys
from app.core.errors import Conflict, not_found
from app.core.money import round_money
from app.customers.models import Customer
from app.customers.service import customer_by_id
from app.events.service import publish
from app.rentals.service import get_rental

THRESHOLD_CROSSED = "budget.threshold_crossed"


def create_budget(
    session: Session, customer: Customer, data: BudgetCreate, caller: Principal, cap: int
) -> Budget:
    """A new budget, refused (409) when the customer already has ``cap`` of them (the
    ``max_budgets_per_customer`` setting)."""
    if data.rental_id is not None:
        rental = get_rental(session, data.rental_id, caller)
        if rental.customer_id != customer.id:
            raise not_found("rental", data.rental_id, ("body", "rental_id"))
    lock_keys(session, [f"budgets:{customer.id}"])  # two creations count one after the other
    if repository.budget_count(session, customer.id) >= cap:
        raise Conflict(
            f"customer {customer.id} has {cap} budgets, the most one may have: delete one "
            "first (GPUMETER_MAX_BUDGETS_PER_CUSTOMER)",
            ("body",),
        )
    budget = Budget(
        customer_id=customer.id,
        rental_id=data.rental_id,
        amount=round_money(data.amount, customer.currency),
        currency=customer.currency,
        thresholds=[t.model_dump(mode="json") for t in data.thresholds],
        hard_limit=data.hard_limit,
    )
    session.add(budget)
    session.flush()
    session.refresh(budget)
    return budget


def update_budget(session: Session, budget: Budget, data: BudgetUpdate) -> Budget:
    """Change what ``data`` sets; crossings already recorded stay (each is published once)."""
    if data.amount is not None:
        budget.amount = round_money(data.amount, budget.currency)
    if data.thresholds is not None:
        budget.thresholds = [t.model_dump(mode="json") for t in data.thresholds]
    if data.hard_limit is not None:
        budget.hard_limit = data.hard_limit
    session.flush()
    return budget


def get_budget(session: Session, budget_id: uuid.UUID, caller: Principal) -> Budget:
    """The budget, if the caller may see its customer; 404 otherwise (existence never leaks)."""
    statement = repository.readable_budgets(caller).where(Budget.id == budget_id)
    budget = session.scalars(statement).one_or_none()
    if budget is None:
        raise not_found("budget", budget_id)
    return budget


def budgets_of(session: Session, customer: Customer) -> list[Budget]:
    return list(session.scalars(repository.budgets_query(customer.id)))


def status(budgets: list[Budget], spend: UsageRead) -> list[BudgetStatus]:
    """Each budget against the usage view's spend (read only: nothing recorded)."""
    return [_status(b, spend) for b in budgets]


def _status(budget: Budget, spend: UsageRead) -> BudgetStatus:
    actual, forecast = _spend(budget, spend)
    currency = budget.currency
    thresholds = []
    for t in budget.thresholds:
        mark = round_money(budget.amount * t["percent"] / 100, currency)
        value = forecast if t["basis"] == Basis.FORECAST else actual
        thresholds.append(
            ThresholdStatus(
                percent=t["percent"],
                basis=t["basis"],
                at=money(mark, currency),
                crossed=value >= mark,
            )
        )
    return BudgetStatus(
        budget=BudgetRead.of(budget),
        period=spend.period,
        spend=money(actual, currency),
        forecast=money(forecast, currency),
        used_percent=(actual * 100 / budget.amount).quantize(Decimal("0.1")),
        thresholds=thresholds,
        blocks_new_rentals=budget.hard_limit
        and budget.rental_id is None
        and actual >= budget.amount,
        forecast_assumes=FORECAST_ASSUMES,
    )


def _spend(budget: Budget, spend: UsageRead) -> tuple[Decimal, Decimal]:
    if budget.rental_id is None:
        return Decimal(spend.cost_to_date), Decimal(spend.forecast)
    for r in spend.rentals:
        if r.rental_id == budget.rental_id:
            return Decimal(r.cost_to_date), Decimal(r.forecast)
    return Decimal(0), Decimal(0)


def current_spend(
    session: Session, customer: Customer, now: datetime, config: UsageSettings
) -> UsageRead:
    return usage(session, customer, current_period(customer.billing_timezone, now), now, config)


def check(session: Session, customer: Customer, now: datetime, config: UsageSettings) -> int:
    """Record and publish the thresholds newly crossed this period; how many there were."""
    budgets = budgets_of(session, customer)
    if not budgets:
        return 0
    spend = current_spend(session, customer, now, config)
    crossed = 0
    for s in status(budgets, spend):
        for t in s.thresholds:
            value = s.forecast if t.basis == Basis.FORECAST else s.spend
            if t.crossed and repository.record_crossing(
                session, s.budget.id, s.period, t.basis.value, t.percent, Decimal(value), now
            ):
                crossed += 1
                publish(
                    session,
                    THRESHOLD_CROSSED,
                    {
                        "budget_id": s.budget.id,
                        "rental_id": s.budget.rental_id,
                        "period": s.period,
                        "basis": t.basis.value,
                        "percent": t.percent,
                        "threshold_amount": t.at,
                        "amount": s.budget.amount,
                        "spend": value,
                        "currency": s.budget.currency,
                    },
                    subject=f"budget/{s.budget.id}",
                    customer_id=customer.id,
                )
    return crossed


def check_all(session: Session, now: datetime, config: UsageSettings) -> CheckRead:
    periods, crossed = {}, 0
    for customer_id in repository.customers_with_budgets(session):
        customer = customer_by_id(session, customer_id)
        if customer is None:
            continue
        crossed += check(session, customer, now, config)
        periods[customer_id] = current_period(customer.billing_timezone, now)
    return CheckRead(period_by_customer=periods, crossed=crossed)


def refuse_rental_over_hard_limit(
    session: Session, customer: Customer, config: UsageSettings
) -> None:
    """Rentals' create check (registered by app.wiring): 409 while a hard limit is reached."""
    limited = [b for b in budgets_of(session, customer) if b.hard_limit and b.rental_id is None]
    if not limited:
        return
    now = datetime.now(UTC)
    spend = current_spend(session, customer, now, config)
    for s in status(limited, spend):
        if s.blocks_new_rentals:
            raise Conflict(
                f"customer {customer.id} has reached its monthly budget hard limit: spend "
                f"{s.spend} of {s.budget.amount} {s.budget.currency} in {s.period}; raise or "
                f"delete budget {s.budget.id} (DELETE /v1/budgets/{s.budget.id}) to create "
                "rentals",
                ("body", "customer_id"),
                extra={"budget_id": str(s.budget.id)},
            )
