"""Budgets: a monthly spending limit per customer (or one of its rentals), with thresholds."""

from __future__ import annotations

import uuid
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import CheckConstraint, ForeignKey, String, UniqueConstraint
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from app.core.base import Base, Timestamped


class Budget(Timestamped, Base):
    """``amount`` per billing month in the customer's currency; ``rental_id`` NULL: the whole
    customer. ``thresholds``: ``[{"percent": 80, "basis": "actual" | "forecast"}, ...]``.
    ``hard_limit``: no new rental may be created while the month's spend is at the amount."""

    __tablename__ = "budgets"
    __table_args__ = (CheckConstraint("amount > 0", name="amount_positive"),)

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    customer_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("customers.id"), index=True)
    rental_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("rentals.id"))
    amount: Mapped[Decimal]
    currency: Mapped[str] = mapped_column(String(3))
    thresholds: Mapped[list[dict[str, Any]]] = mapped_column(JSONB)
    hard_limit: Mapped[bool] = mapped_column(default=False)


class BudgetCrossing(Base):
    """A threshold crossed in a period, recorded once so its event is published once."""

    __tablename__ = "budget_crossings"
    __table_args__ = (UniqueConstraint("budget_id", "period", "basis", "percent"),)

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    budget_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("budgets.id", ondelete="CASCADE"))
    period: Mapped[str] = mapped_column(String(7))
    basis: Mapped[str] = mapped_column(String(16))
    percent: Mapped[int]
    spend: Mapped[Decimal]
    crossed_at: Mapped[datetime]
