"""Billing: invoices, invoice lines, gapless number counters, voucher ledger; immutability.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29 16:14:51.313240
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Finalized, paid and void invoices are immutable: only finalized -> paid (with paid_at) or
# finalized -> void (with voided_at, void_reason) and the Stripe mirror columns may change.
# The check compares the whole row as JSON minus the columns the transition may change.
INVOICE_TRIGGERS = """
CREATE FUNCTION invoices_immutable() RETURNS trigger AS $$
DECLARE
    stripe CONSTANT text[] := ARRAY['stripe_invoice_id', 'stripe_invoice_number',
        'stripe_hosted_url', 'stripe_status', 'stripe_error'];
    allowed boolean;
BEGIN
    IF OLD.status = 'draft' THEN
        RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
    END IF;
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'invoice % is % and cannot be deleted', OLD.number, OLD.status
            USING ERRCODE = 'restrict_violation';
    END IF;
    allowed := CASE
        WHEN NEW.status = OLD.status THEN
            (to_jsonb(NEW) - stripe) = (to_jsonb(OLD) - stripe)
        WHEN OLD.status = 'finalized' AND NEW.status = 'paid' THEN
            NEW.paid_at IS NOT NULL AND (to_jsonb(NEW) - stripe - 'status' - 'paid_at')
                = (to_jsonb(OLD) - stripe - 'status' - 'paid_at')
        WHEN OLD.status = 'finalized' AND NEW.status = 'void' THEN
            NEW.voided_at IS NOT NULL
                AND (to_jsonb(NEW) - stripe - 'status' - 'voided_at' - 'void_reason')
                = (to_jsonb(OLD) - stripe - 'status' - 'voided_at' - 'void_reason')
        ELSE false
    END;
    IF NOT allowed THEN
        RAISE EXCEPTION 'invoice % is % and immutable: only finalized -> paid | void and the '
            'Stripe columns may change', OLD.number, OLD.status
            USING ERRCODE = 'restrict_violation';
    END IF;
    RETURN NEW;
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER invoices_immutable BEFORE UPDATE OR DELETE ON invoices
    FOR EACH ROW EXECUTE FUNCTION invoices_immutable();

-- Lines change only while their invoice is a draft (a missing invoice: a draft being deleted).
CREATE FUNCTION invoice_lines_immutable() RETURNS trigger AS $$
DECLARE
    locked text;
BEGIN
    SELECT number INTO locked FROM invoices
     WHERE status <> 'draft' AND id IN (
        CASE WHEN TG_OP <> 'INSERT' THEN OLD.invoice_id END,
        CASE WHEN TG_OP <> 'DELETE' THEN NEW.invoice_id END);
    IF FOUND THEN
        RAISE EXCEPTION 'lines of invoice % are immutable', locked
            USING ERRCODE = 'restrict_violation';
    END IF;
    RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER invoice_lines_immutable BEFORE INSERT OR UPDATE OR DELETE ON invoice_lines
    FOR EACH ROW EXECUTE FUNCTION invoice_lines_immutable();

-- The voucher ledger is append-only, except the provisional entries of a draft invoice.
CREATE FUNCTION voucher_entries_append_only() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'DELETE' AND OLD.invoice_id IS NOT NULL AND NOT EXISTS (
        SELECT 1 FROM invoices WHERE id = OLD.invoice_id AND status <> 'draft'
    ) THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'voucher ledger entries are append-only (entry %)', OLD.id
        USING ERRCODE = 'restrict_violation';
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER voucher_entries_append_only BEFORE UPDATE OR DELETE ON voucher_entries
    FOR EACH ROW EXECUTE FUNCTION voucher_entries_append_only();
"""

DROP_TRIGGERS = """
DROP TRIGGER voucher_entries_append_only ON voucher_entries;
DROP FUNCTION voucher_entries_append_only();
DROP TRIGGER invoice_lines_immutable ON invoice_lines;
DROP FUNCTION invoice_lines_immutable();
DROP TRIGGER invoices_immutable ON invoices;
DROP FUNCTION invoices_immutable();
"""


def upgrade() -> None:
    op.create_table(
        "invoice_number_counters",
        sa.Column("year", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("last_number", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("year", name=op.f("pk_invoice_number_counters")),
    )
    op.create_table(
        "invoices",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("customer_id", sa.Uuid(), nullable=False),
        sa.Column("period", sa.String(length=7), nullable=False),
        sa.Column("period_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("period_end", sa.DateTime(timezone=True), nullable=False),
        sa.Column("timezone", sa.String(length=64), nullable=False),
        sa.Column("currency", sa.String(length=3), nullable=False),
        sa.Column(
            "status",
            sa.Enum("draft", "finalized", "paid", "void", name="invoice_status"),
            nullable=False,
        ),
        sa.Column("number", sa.String(length=32), nullable=True),
        sa.Column("tax_rate", sa.Numeric(precision=7, scale=6), nullable=False),
        sa.Column("subtotal", sa.Numeric(precision=28, scale=10), nullable=False),
        sa.Column("tax", sa.Numeric(precision=28, scale=10), nullable=False),
        sa.Column("total", sa.Numeric(precision=28, scale=10), nullable=False),
        sa.Column("generated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finalized_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("paid_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("voided_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("void_reason", sa.String(length=500), nullable=True),
        sa.Column("stripe_invoice_id", sa.String(length=255), nullable=True),
        sa.Column("stripe_invoice_number", sa.String(length=255), nullable=True),
        sa.Column("stripe_hosted_url", sa.String(length=2000), nullable=True),
        sa.Column("stripe_status", sa.String(length=32), nullable=True),
        sa.Column("stripe_error", sa.String(length=2000), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.CheckConstraint(
            "(status = 'draft') = (number IS NULL)", name=op.f("ck_invoices_numbered_once_final")
        ),
        sa.CheckConstraint(
            "period ~ '^[0-9]{4}-[0-9]{2}$'", name=op.f("ck_invoices_period_format")
        ),
        sa.ForeignKeyConstraint(
            ["customer_id"], ["customers.id"], name=op.f("fk_invoices_customer_id_customers")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_invoices")),
        sa.UniqueConstraint("number", name=op.f("uq_invoices_number")),
        sa.UniqueConstraint("stripe_invoice_id", name=op.f("uq_invoices_stripe_invoice_id")),
    )
    op.create_index(op.f("ix_invoices_customer_id"), "invoices", ["customer_id"], unique=False)
    op.create_index(
        "uq_invoices_customer_period_live",
        "invoices",
        ["customer_id", "period"],
        unique=True,
        postgresql_where=sa.text("status <> 'void'"),
    )
    op.create_table(
        "invoice_lines",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("invoice_id", sa.Uuid(), nullable=False),
        sa.Column("customer_id", sa.Uuid(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("amount", sa.Numeric(precision=28, scale=10), nullable=False),
        sa.Column("rental_id", sa.Uuid(), nullable=True),
        sa.Column("gpu_model", sa.String(length=100), nullable=True),
        sa.Column("gpu_uuid", sa.String(length=96), nullable=True),
        sa.Column("start_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("end_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("seconds", sa.BigInteger(), nullable=True),
        sa.Column("rate", sa.Numeric(precision=28, scale=10), nullable=True),
        sa.Column("voucher_id", sa.String(length=200), nullable=True),
        sa.Column("evidence", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("adjusts_invoice_id", sa.Uuid(), nullable=True),
        sa.Column("adjusts_period", sa.String(length=7), nullable=True),
        sa.ForeignKeyConstraint(
            ["adjusts_invoice_id"],
            ["invoices.id"],
            name=op.f("fk_invoice_lines_adjusts_invoice_id_invoices"),
        ),
        sa.ForeignKeyConstraint(
            ["customer_id"], ["customers.id"], name=op.f("fk_invoice_lines_customer_id_customers")
        ),
        sa.ForeignKeyConstraint(
            ["invoice_id"],
            ["invoices.id"],
            name=op.f("fk_invoice_lines_invoice_id_invoices"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["rental_id"], ["rentals.id"], name=op.f("fk_invoice_lines_rental_id_rentals")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_invoice_lines")),
    )
    op.create_index(
        "ix_invoice_lines_adjusts",
        "invoice_lines",
        ["adjusts_invoice_id", "rental_id"],
        unique=False,
    )
    op.create_index(
        op.f("ix_invoice_lines_invoice_id"), "invoice_lines", ["invoice_id"], unique=False
    )
    op.create_table(
        "voucher_entries",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("customer_id", sa.Uuid(), nullable=False),
        sa.Column("voucher_id", sa.String(length=200), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("amount", sa.Numeric(precision=28, scale=10), nullable=False),
        sa.Column("currency", sa.String(length=3), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("source", sa.String(length=16), nullable=True),
        sa.Column("reason", sa.String(length=500), nullable=False),
        sa.Column("invoice_id", sa.Uuid(), nullable=True),
        sa.Column("created_by", sa.Uuid(), nullable=True),
        sa.CheckConstraint(
            "(kind = 'issued') = (expires_at IS NOT NULL)",
            name=op.f("ck_voucher_entries_expiry_on_issue"),
        ),
        sa.CheckConstraint("amount > 0", name=op.f("ck_voucher_entries_amount_positive")),
        sa.ForeignKeyConstraint(
            ["customer_id"], ["customers.id"], name=op.f("fk_voucher_entries_customer_id_customers")
        ),
        sa.ForeignKeyConstraint(
            ["invoice_id"],
            ["invoices.id"],
            name=op.f("fk_voucher_entries_invoice_id_invoices"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_voucher_entries")),
    )
    op.create_index(
        op.f("ix_voucher_entries_customer_id"), "voucher_entries", ["customer_id"], unique=False
    )
    op.create_index(
        op.f("ix_voucher_entries_invoice_id"), "voucher_entries", ["invoice_id"], unique=False
    )
    op.create_index(
        "uq_voucher_entries_issued",
        "voucher_entries",
        ["voucher_id"],
        unique=True,
        postgresql_where=sa.text("kind = 'issued'"),
    )
    op.execute(INVOICE_TRIGGERS)


def downgrade() -> None:
    op.execute(DROP_TRIGGERS)
    op.drop_index(
        "uq_voucher_entries_issued",
        table_name="voucher_entries",
        postgresql_where=sa.text("kind = 'issued'"),
    )
    op.drop_index(op.f("ix_voucher_entries_invoice_id"), table_name="voucher_entries")
    op.drop_index(op.f("ix_voucher_entries_customer_id"), table_name="voucher_entries")
    op.drop_table("voucher_entries")
    op.drop_index(op.f("ix_invoice_lines_invoice_id"), table_name="invoice_lines")
    op.drop_index("ix_invoice_lines_adjusts", table_name="invoice_lines")
    op.drop_table("invoice_lines")
    op.drop_index(
        "uq_invoices_customer_period_live",
        table_name="invoices",
        postgresql_where=sa.text("status <> 'void'"),
    )
    op.drop_index(op.f("ix_invoices_customer_id"), table_name="invoices")
    op.drop_table("invoices")
    op.drop_table("invoice_number_counters")
