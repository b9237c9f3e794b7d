"""The prepaid balance ledger: one append-only row per movement of a customer's balance."""

from __future__ import annotations

import uuid
from datetime import datetime
from enum import StrEnum

from sqlalchemy import BigInteger, CheckConstraint, ForeignKey, Index, String
from sqlalchemy.orm import Mapped, mapped_column

from app.core.base import Base


class EntryKind(StrEnum):
    TRIAL = "trial"  # the signup credit, once per customer
    TOP_UP = "top_up"  # an admin's or a Stripe payment's top-up
    APPLIED = "applied"  # taken by a finalized invoice (negative)
    RETURNED = "returned"  # given back when that invoice was voided


class BalanceEntry(Base):
    """``amount_minor`` in the currency's minor units (cents; fils for KWD), positive for money
    in, negative for money out; ``balance_minor`` is the balance after this entry, which the
    database keeps at zero or above. ``key`` makes every movement idempotent: ``trial:<customer>``,
    ``stripe:<payment intent>``, ``invoice:<invoice>``, ``void:<invoice>``, ``admin:<uuid>``."""

    __tablename__ = "balance_entries"
    __table_args__ = (
        CheckConstraint("amount_minor <> 0", name="amount_nonzero"),
        CheckConstraint("balance_minor >= 0", name="never_negative"),
        Index("ix_balance_entries_customer_seq", "customer_id", "seq"),
    )

    seq: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    key: Mapped[str] = mapped_column(String(200), unique=True)
    customer_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("customers.id"))
    kind: Mapped[str] = mapped_column(String(16))
    amount_minor: Mapped[int] = mapped_column(BigInteger)
    balance_minor: Mapped[int] = mapped_column(BigInteger)
    currency: Mapped[str] = mapped_column(String(3))
    invoice_id: Mapped[uuid.UUID | None]  # the invoice it was applied to or returned from
    reason: Mapped[str] = mapped_column(String(500))
    created_by: Mapped[uuid.UUID | None]  # the admin key of a manual top-up
    at: Mapped[datetime]
