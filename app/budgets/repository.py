from __future__ import annotations

import uuid
from datetime import datetime
from decimal import Decimal

from sqlalchemy import Select, func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from app.auth.service import Principal
from app.auth.tenancy import readable_by
from app.budgets.models import Budget, BudgetCrossing


def readable_budgets(principal: Principal) -> Select[Budget]:
    """Every budget the principal may read; a get by id starts here."""
    return select(Budget).where(readable_by(principal, Budget.customer_id))


def budgets_query(customer_id: uuid.UUID | None = None) -> Select[Budget]:
    query = select(Budget).order_by(Budget.customer_id, Budget.created_at, Budget.id)
    return query if customer_id is None else query.where(Budget.customer_id == customer_id)


def budget_count(session: Session, customer_id: uuid.UUID) -> int:
    query = select(func.count()).select_from(Budget).where(Budget.customer_id == customer_id)
    return session.scalar(query) or 0


def customers_with_budgets(session: Session) -> list[uuid.UUID]:
    return list(session.scalars(select(Budget.customer_id).distinct()))


def record_crossing(
    session: Session,
    budget_id: uuid.UUID,
    period: str,
    basis: str,
    percent: int,
    spend: Decimal,
    at: datetime,
) -> bool:
    """Record the crossing once; True if this call recorded it (so its event is due)."""
    statement = (
        insert(BudgetCrossing)
        .values(
            budget_id=budget_id,
            period=period,
            basis=basis,
            percent=percent,
            spend=spend,
            crossed_at=at,
        )
        .on_conflict_do_nothing()
        .returning(BudgetCrossing.id)
    )
    return session.scalar(statement) is not None
