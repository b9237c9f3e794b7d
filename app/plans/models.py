from __future__ import annotations

import uuid
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import CheckConstraint, ForeignKey, Index, String, text, true
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column, relationship

from app.core.base import Base, Timestamped


class PricePlan(Timestamped, Base):
    __tablename__ = "price_plans"
    __table_args__ = (
        CheckConstraint("increment_s >= 1", name="increment_positive"),
        CheckConstraint("minimum_s >= 0", name="minimum_not_negative"),
        CheckConstraint("voucher_validity_days >= 1", name="validity_positive"),
        CheckConstraint(
            "migrate_degraded_after_s IS NULL OR migrate_degraded_after_s BETWEEN 1 AND 86400",
            name="degraded_after_range",
        ),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    currency: Mapped[str] = mapped_column(String(3))
    increment_s: Mapped[int] = mapped_column(default=1)
    minimum_s: Mapped[int] = mapped_column(default=1)
    bill_degraded: Mapped[bool] = mapped_column(default=True)
    bill_unmetered: Mapped[bool] = mapped_column(default=False)
    # A failure credits the rental's other GPUs until the job runs again (``stall_credit``).
    credit_stall: Mapped[bool] = mapped_column(default=True, server_default=true())
    # The spare policy for degraded GPUs: a rented GPU degraded this long by one of these
    # causes (app.metering.causes) is failed over to a spare; None: never.
    migrate_degraded_after_s: Mapped[int | None]
    migrate_degraded_causes: Mapped[list[str]] = mapped_column(
        JSONB, default=list, server_default=text("'[]'::jsonb")
    )
    # [{"min_days": 7, "percent": "5"}, ...]: share of a long rental's charges returned as voucher.
    voucher_tiers: Mapped[list[dict[str, Any]]] = mapped_column(JSONB, default=list)
    voucher_validity_days: Mapped[int] = mapped_column(default=90)

    prices: Mapped[list[PlanPrice]] = relationship(
        back_populates="plan", order_by="PlanPrice.effective_from", lazy="selectin"
    )


class PlanPrice(Timestamped, Base):
    """An effective-dated hourly price of one GPU model and its monthly cap per GPU (the
    ceiling on a rental's monthly charge per GPU, e.g. the reserved price; effective with the
    price); with customer_id, a contract override."""

    __tablename__ = "plan_prices"
    __table_args__ = (
        CheckConstraint("price_per_hour >= 0", name="price_not_negative"),
        CheckConstraint(
            "preemptible_price_per_hour IS NULL OR preemptible_price_per_hour >= 0",
            name="preemptible_price_not_negative",
        ),
        CheckConstraint(
            "monthly_cap_per_gpu IS NULL OR monthly_cap_per_gpu > 0", name="cap_positive"
        ),
        Index(
            "uq_plan_prices_plan_model_customer_from",
            "plan_id",
            "gpu_model",
            "customer_id",
            "effective_from",
            unique=True,
            postgresql_nulls_not_distinct=True,
        ),
    )

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    plan_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("price_plans.id", ondelete="CASCADE"))
    gpu_model: Mapped[str] = mapped_column(String(100))
    price_per_hour: Mapped[Decimal]
    monthly_cap_per_gpu: Mapped[Decimal | None]
    # The hourly price of a preemptible rental (an idle hot spare a failover may take back).
    preemptible_price_per_hour: Mapped[Decimal | None]
    effective_from: Mapped[datetime]
    customer_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("customers.id", ondelete="CASCADE"), index=True
    )

    plan: Mapped[PricePlan] = relationship(back_populates="prices")
