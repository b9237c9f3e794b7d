from __future__ import annotations

import uuid
from datetime import datetime
from decimal import Decimal

from sqlalchemy import CheckConstraint, Numeric, String
from sqlalchemy.orm import Mapped, mapped_column

from app.core.base import Base, Timestamped


class Customer(Timestamped, Base):
    __tablename__ = "customers"
    __table_args__ = (
        CheckConstraint("tax_rate IS NULL OR (tax_rate >= 0 AND tax_rate < 1)", name="tax_rate"),
        CheckConstraint("days_until_due >= 0", name="days_until_due"),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    name: Mapped[str] = mapped_column(String(200))
    email: Mapped[str | None] = mapped_column(String(320))
    currency: Mapped[str] = mapped_column(String(3))
    billing_timezone: Mapped[str] = mapped_column(String(64), default="UTC")
    tax_rate: Mapped[Decimal | None] = mapped_column(Numeric(7, 6))
    stripe_customer_id: Mapped[str | None] = mapped_column(String(255), unique=True)
    # Stripe collection: "charge_automatically" or "send_invoice" (with days_until_due).
    collection_method: Mapped[str] = mapped_column(String(32), default="send_invoice")
    days_until_due: Mapped[int] = mapped_column(default=30)
    # Portal links and dashboard sessions issued until then are void (an admin revoked them).
    portal_revoked_at: Mapped[datetime | None]
