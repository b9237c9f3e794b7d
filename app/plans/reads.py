"""Plans' read interface: a plan by id and which customers have contract prices, as billing's
loader rates them.

The rest of ``app.plans.repository`` is private to the package.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.plans.models import PlanPrice, PricePlan


def plan_by_id(session: Session, plan_id: uuid.UUID) -> PricePlan:
    return session.get_one(PricePlan, plan_id)


def contract_priced(
    session: Session, customer_ids: Collection[uuid.UUID]
) -> set[tuple[uuid.UUID, uuid.UUID | None]]:
    """(plan, customer) for each plan with a contract price of one of the customers."""
    query = (
        select(PlanPrice.plan_id, PlanPrice.customer_id)
        .distinct()
        .where(PlanPrice.customer_id.in_(customer_ids))
    )
    return {(plan, customer) for plan, customer in session.execute(query)}
