from __future__ import annotations

import uuid

from sqlalchemy import Select, exists, or_, select

from app.plans.models import PlanPrice, PricePlan
from app.rentals.models import Rental


def plans_query(*, customer_id: uuid.UUID | None = None) -> Select[PricePlan]:
    """Plans; with customer_id, only plans that customer rents on."""
    query = select(PricePlan).order_by(PricePlan.name)
    if customer_id is not None:
        query = query.where(
            exists().where(Rental.plan_id == PricePlan.id, Rental.customer_id == customer_id)
        )
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
