from __future__ import annotations

import uuid

from fastapi import APIRouter

from app.auth.deps import Admin, ConsoleUser
from app.billing.endpoints import Now
from app.billing.usage import UsageSettings
from app.budgets import repository, service
from app.budgets.schemas import BudgetCreate, BudgetRead, BudgetStatus, BudgetUpdate, CheckRead
from app.core.deps import AppSettings, DbSession
from app.core.errors import error_responses
from app.core.pagination import Page, Paging, page_of, paginate
from app.customers.service import get_customer

router = APIRouter(tags=["budgets"])


@router.post("/v1/customers/{customer_id}/budgets", status_code=201)
def create_budget(
    customer_id: uuid.UUID,
    body: BudgetCreate,
    session: DbSession,
    caller: ConsoleUser,
    settings: AppSettings,
) -> BudgetRead:
    """A monthly budget for the customer (or one of its rentals), with thresholds of actual
    and forecast spend; a hard limit refuses new rentals once the month's spend reaches it."""
    customer = get_customer(session, customer_id, caller)
    cap = settings.max_budgets_per_customer
    return BudgetRead.of(service.create_budget(session, customer, body, caller, cap))


@router.get("/v1/customers/{customer_id}/budgets")
def list_budgets(
    customer_id: uuid.UUID, session: DbSession, caller: ConsoleUser, page: Paging
) -> Page[BudgetRead]:
    customer = get_customer(session, customer_id, caller)
    return paginate(session, repository.budgets_query(customer.id), page, BudgetRead, BudgetRead.of)


@router.patch("/v1/budgets/{budget_id}", responses=error_responses(404, 422))
def update_budget(
    budget_id: uuid.UUID, body: BudgetUpdate, session: DbSession, caller: ConsoleUser
) -> BudgetRead:
    """Change the budget's amount, thresholds or hard limit (its scope stays)."""
    budget = service.get_budget(session, budget_id, caller)
    return BudgetRead.of(service.update_budget(session, budget, body))


@router.delete("/v1/budgets/{budget_id}")
def delete_budget(budget_id: uuid.UUID, session: DbSession, caller: ConsoleUser) -> BudgetRead:
    """Delete the budget (its crossings go with it); answers what was deleted."""
    budget = service.get_budget(session, budget_id, caller)
    deleted = BudgetRead.of(budget)
    session.delete(budget)
    return deleted


@router.get("/v1/customers/{customer_id}/budgets/status")
def budget_status(
    customer_id: uuid.UUID,
    session: DbSession,
    caller: ConsoleUser,
    now: Now,
    page: Paging,
    settings: AppSettings,
) -> Page[BudgetStatus]:
    """Each budget against this month's spend so far and its forecast."""
    customer = get_customer(session, customer_id, caller)
    spend = service.current_spend(session, customer, now, UsageSettings.of(settings))
    return page_of(service.status(service.budgets_of(session, customer), spend), page)


@router.post("/v1/budget-checks")
def check_budgets(session: DbSession, _: Admin, now: Now, settings: AppSettings) -> CheckRead:
    """Evaluate every budget for its customer's current month: each threshold newly crossed
    is recorded and published once as ``budget.threshold_crossed`` (run it on a schedule)."""
    return service.check_all(session, now, UsageSettings.of(settings))
