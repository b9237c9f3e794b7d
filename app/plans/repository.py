from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import Select, exists, or_, select
from sqlalchemy.orm import Session

from app.auth.service import Principal
from app.plans.models import PlanPrice, PricePlan
from app.rentals.reads import rents_on


def readable_plans(principal: Principal) -> Select[PricePlan]:
    """Every plan the principal may read: all for an admin, the plans it rents on for a
    customer key; every list and get of plans starts here."""
    return plans_query(customer_id=principal.customer_scope)


def readable_prices(principal: Principal, plan_id: uuid.UUID) -> Select[PlanPrice]:
    """The plan's prices the principal may read: base prices and its own overrides."""
    return prices_query(plan_id, customer_id=principal.customer_scope)


def plans_query(*, customer_id: uuid.UUID | None = None) -> Select[PricePlan]:
    """Plans; with customer_id, only plans that customer rents on."""
    query = select(PricePlan).order_by(PricePlan.name)
    if customer_id is not None:
        query = query.where(rents_on(customer_id, PricePlan.id))
    return query


def prices_query(
    plan_id: uuid.UUID, *, customer_id: uuid.UUID | None = None, model: str | None = None
) -> Select[PlanPrice]:
    """A plan's prices; with customer_id, the base prices and that customer's overrides only."""
    query = select(PlanPrice).where(PlanPrice.plan_id == plan_id)
    if customer_id is not None:
        query = query.where(
            or_(PlanPrice.customer_id.is_(None), PlanPrice.customer_id == customer_id)
        )
    if model is not None:
        query = query.where(PlanPrice.gpu_model == model)
    return query.order_by(PlanPrice.gpu_model, PlanPrice.effective_from, PlanPrice.id)


def prices_added_since(
    session: Session, customer_id: uuid.UUID, before: datetime, since: datetime
) -> bool:
    query = select(
        exists().where(
            PlanPrice.created_at > since,
            PlanPrice.effective_from < before,
            or_(PlanPrice.customer_id.is_(None), PlanPrice.customer_id == customer_id),
            rents_on(customer_id, PlanPrice.plan_id),
        )
    )
    return bool(session.scalar(query))


# --- read by billing's loader -------------------------------------------------------------


def degraded_migrating_plans(session: Session) -> list[PricePlan]:
    """The plans whose spare policy migrates degraded GPUs."""
    return list(
        session.scalars(select(PricePlan).where(PricePlan.migrate_degraded_after_s.is_not(None)))
    )
