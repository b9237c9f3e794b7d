from __future__ import annotations

import uuid

from fastapi import APIRouter
from sqlalchemy.orm import Session

from app.auth.deps import Admin, ConsoleUser
from app.auth.service import Principal
from app.core.deps import DbSession
from app.core.pagination import Page, Paging, paginate
from app.plans import repository, service
from app.plans.models import PricePlan
from app.plans.schemas import PlanCreate, PlanRead, PlanUpdate, PriceCreate, PriceRead

router = APIRouter(prefix="/v1/plans", tags=["price plans"])


def plan_read(session: Session, plan: PricePlan, principal: Principal) -> PlanRead:
    """The plan with the prices this caller may see (never another customer's contract)."""
    prices = service.visible_prices(session, plan, principal)
    return PlanRead.model_validate(plan).model_copy(update={"prices": prices})


@router.post("", status_code=201)
def create_plan(body: PlanCreate, session: DbSession, admin: Admin) -> PlanRead:
    return plan_read(session, service.create_plan(session, body), admin)


@router.get("")
def list_plans(session: DbSession, caller: ConsoleUser, page: Paging) -> Page[PlanRead]:
    """Admins see every plan; a customer sees the plans it rents on, with its own prices."""
    query = repository.readable_plans(caller)
    return paginate(session, query, page, PlanRead, lambda plan: plan_read(session, plan, caller))


@router.get("/{plan_id}")
def read_plan(plan_id: uuid.UUID, session: DbSession, caller: ConsoleUser) -> PlanRead:
    return plan_read(session, service.get_plan(session, plan_id, caller), caller)


@router.patch("/{plan_id}")
def update_plan(plan_id: uuid.UUID, body: PlanUpdate, session: DbSession, admin: Admin) -> PlanRead:
    plan = service.update_plan(session, service.get_plan(session, plan_id, admin), body)
    return plan_read(session, plan, admin)


@router.post("/{plan_id}/prices", status_code=201)
def add_price(plan_id: uuid.UUID, body: PriceCreate, session: DbSession, admin: Admin) -> PriceRead:
    """Add an effective-dated price; with customer_id it is that customer's contract price."""
    plan = service.get_plan(session, plan_id, admin)
    return PriceRead.model_validate(service.add_price(session, plan, body))


@router.get("/{plan_id}/prices")
def list_prices(
    plan_id: uuid.UUID, session: DbSession, caller: ConsoleUser, page: Paging
) -> Page[PriceRead]:
    """The plan's prices this caller may see, oldest first, a page at a time."""
    plan = service.get_plan(session, plan_id, caller)
    return paginate(session, service.visible_prices_query(plan, caller), page, PriceRead)
