"""Invoice tables: invoices, their lines, the gapless number counters and the voucher ledger.

Finalized, paid and void invoices and their lines are immutable in the database: a trigger
(migration 0003) refuses every change except the status transitions finalized -> paid | void
and the Stripe mirror columns. Every table carries ``customer_id`` (the distribution key).
"""

from __future__ import annotations

import uuid
from datetime import datetime
from decimal import Decimal
from enum import StrEnum
from typing import Any

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    ForeignKey,
    Index,
    Integer,
    Numeric,
    String,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column, relationship

from app.core.base import Base, Timestamped, pg_enum


class InvoiceStatus(StrEnum):
    DRAFT = "draft"
    FINALIZED = "finalized"
    PAID = "paid"
    VOID = "void"


class Invoice(Timestamped, Base):
    __tablename__ = "invoices"
    __table_args__ = (
        # One live invoice per customer and period; a voided one may be replaced.
        Index(
            "uq_invoices_customer_period_live",
            "customer_id",
            "period",
            unique=True,
            postgresql_where=text("status <> 'void'"),
        ),
        CheckConstraint("(status = 'draft') = (number IS NULL)", name="numbered_once_final"),
        CheckConstraint("period ~ '^[0-9]{4}-[0-9]{2}$'", name="period_format"),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    customer_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("customers.id"), index=True)
    period: Mapped[str] = mapped_column(String(7))  # "YYYY-MM" in the customer's time zone
    period_start: Mapped[datetime]
    period_end: Mapped[datetime]
    timezone: Mapped[str] = mapped_column(String(64))
    currency: Mapped[str] = mapped_column(String(3))
    status: Mapped[InvoiceStatus] = mapped_column(
        pg_enum(InvoiceStatus, "invoice_status"), default=InvoiceStatus.DRAFT
    )
    number: Mapped[str | None] = mapped_column(String(32), unique=True)
    tax_rate: Mapped[Decimal] = mapped_column(Numeric(7, 6))
    subtotal: Mapped[Decimal]  # every line but tax and the prepaid balance
    tax: Mapped[Decimal]
    # The sum of all lines, the prepaid balance's too: the amount due (what Stripe collects).
    # The API's ``total`` is subtotal + tax (before the prepaid balance), as Stripe's is.
    total: Mapped[Decimal]
    generated_at: Mapped[datetime]
    finalized_at: Mapped[datetime | None]
    due_at: Mapped[datetime | None]  # finalization + the customer's payment terms
    paid_at: Mapped[datetime | None]
    voided_at: Mapped[datetime | None]
    void_reason: Mapped[str | None] = mapped_column(String(500))
    # The Stripe mirror's columns: the only ones that may change once finalized.
    stripe_invoice_id: Mapped[str | None] = mapped_column(String(255), unique=True)
    stripe_invoice_number: Mapped[str | None] = mapped_column(String(255))
    stripe_hosted_url: Mapped[str | None] = mapped_column(String(2000))
    stripe_status: Mapped[str | None] = mapped_column(String(32))
    stripe_error: Mapped[str | None] = mapped_column(String(2000))

    lines: Mapped[list[InvoiceLineRow]] = relationship(
        foreign_keys="InvoiceLineRow.invoice_id",
        order_by="InvoiceLineRow.position",
        lazy="selectin",
        viewonly=True,
    )


class InvoiceLineRow(Base):
    """One invoice line as the billing core produced it, in its order on the invoice."""

    __tablename__ = "invoice_lines"
    __table_args__ = (Index("ix_invoice_lines_adjusts", "adjusts_invoice_id", "rental_id"),)

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    invoice_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("invoices.id", ondelete="CASCADE"), index=True
    )
    customer_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("customers.id"))
    position: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(32))
    amount: Mapped[Decimal]
    rental_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("rentals.id"))
    gpu_model: Mapped[str | None] = mapped_column(String(100))
    gpu_uuid: Mapped[str | None] = mapped_column(String(96))
    start_at: Mapped[datetime | None]
    end_at: Mapped[datetime | None]
    seconds: Mapped[int | None]
    rate: Mapped[Decimal | None]  # price per GPU-hour, or the tax rate on the tax line
    voucher_id: Mapped[str | None] = mapped_column(String(200))
    evidence: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    # Adjustment lines: the earlier finalized invoice (and its period) they correct.
    adjusts_invoice_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("invoices.id"))
    adjusts_period: Mapped[str | None] = mapped_column(String(7))


class InvoiceNumberCounter(Base):
    """The last number handed out per year; its row is locked by each finalization."""

    __tablename__ = "invoice_number_counters"

    year: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    last_number: Mapped[int]


class VoucherEntryRow(Base):
    """One voucher ledger entry (issued, applied or expired); amounts are positive.

    Entries written for a draft invoice are provisional: regenerating the draft replaces them.
    """

    __tablename__ = "voucher_entries"
    __table_args__ = (
        CheckConstraint("amount > 0", name="amount_positive"),
        CheckConstraint("(kind = 'issued') = (expires_at IS NOT NULL)", name="expiry_on_issue"),
        # Issuing is idempotent by voucher id (tier vouchers: one per rental and period).
        Index(
            "uq_voucher_entries_issued",
            "voucher_id",
            unique=True,
            postgresql_where=text("kind = 'issued'"),
        ),
    )

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    customer_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("customers.id"), index=True)
    voucher_id: Mapped[str] = mapped_column(String(200))
    kind: Mapped[str] = mapped_column(String(16))
    amount: Mapped[Decimal]
    currency: Mapped[str] = mapped_column(String(3))
    at: Mapped[datetime]
    expires_at: Mapped[datetime | None]
    source: Mapped[str | None] = mapped_column(String(16))  # issued: tier | manual | reissue
    reason: Mapped[str] = mapped_column(String(500), default="")
    invoice_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("invoices.id", ondelete="CASCADE"), index=True
    )
    created_by: Mapped[uuid.UUID | None]  # the admin key of a manual grant


class CreditNote(Timestamped, Base):
    """What a negative late-data adjustment takes beyond the period's charges, credited on the
    invoice it corrects: numbered ``CN-<year>-<000001>`` without gaps (its own series) and
    immutable once issued (a trigger, migration 0008; only the Stripe columns may change)."""

    __tablename__ = "credit_notes"
    __table_args__ = (
        CheckConstraint("amount > 0", name="amount_positive"),
        Index("ix_credit_notes_stripe_pending", "id", postgresql_where=text("stripe_id IS NULL")),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    customer_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("customers.id"), index=True)
    number: Mapped[str] = mapped_column(String(32), unique=True)
    # The finalized invoice it corrects, and the invoice whose adjustments it came from.
    invoice_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("invoices.id"), index=True)
    issued_with_invoice_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("invoices.id"))
    currency: Mapped[str] = mapped_column(String(3))
    amount: Mapped[Decimal]  # before tax, positive
    tax_rate: Mapped[Decimal] = mapped_column(Numeric(7, 6))
    tax: Mapped[Decimal]
    total: Mapped[Decimal]
    reason: Mapped[str] = mapped_column(String(500))
    issued_at: Mapped[datetime]
    stripe_id: Mapped[str | None] = mapped_column(String(255), unique=True)
    stripe_status: Mapped[str | None] = mapped_column(String(32))
    stripe_error: Mapped[str | None] = mapped_column(String(2000))


class CreditNoteNumberCounter(Base):
    """The last credit-note number handed out per year (a series apart from invoices')."""

    __tablename__ = "credit_note_number_counters"

    year: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    last_number: Mapped[int]


class UsageRollup(Base):
    """One rated piece of a rental on a GPU within one stored span (a closed local day or a
    closed hour of the open day) and one price period: its bucket, and its idle seconds
    (billable seconds in idle minutes).

    Written only by ``app.billing.rollups`` from ``rating``'s own pieces, so summing them and
    the rest of the open day rated live gives what rating the whole period gives (a property test).
    """

    __tablename__ = "usage_rollups"
    __table_args__ = (
        CheckConstraint('"end" > start', name="end_after_start"),
        Index("ix_usage_rollups_customer_start", "customer_id", "start"),
    )

    # No foreign key to rentals: a derived cache, rebuilt from them; rentals are never deleted.
    rental_id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    gpu_uuid: Mapped[str] = mapped_column(String(96), primary_key=True)
    start: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    end: Mapped[int] = mapped_column(BigInteger)
    customer_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("customers.id"))
    bucket: Mapped[str] = mapped_column(String(24))
    price_from: Mapped[int] = mapped_column(BigInteger)  # the price point in effect
    idle_s: Mapped[int] = mapped_column(Integer)


class UsageRollupSpan(Base):
    """A stored span of rollups, a closed local day or a closed hour of the open day, with the
    fingerprint of the inputs its parts were rated from (segments, assignments, migrations,
    maintenance, plan terms, clipped to the span): a read that computes another fingerprint,
    or wants another span starting there, re-rates it."""

    __tablename__ = "usage_rollup_spans"

    customer_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("customers.id"), primary_key=True)
    start: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    end: Mapped[int] = mapped_column(BigInteger)
    fingerprint: Mapped[int] = mapped_column(BigInteger)
    rated_at: Mapped[datetime] = mapped_column(server_default=text("now()"))
