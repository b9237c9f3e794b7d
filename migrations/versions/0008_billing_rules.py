"""Billing rules: caps per GPU model with the price, invoice due dates, credit notes.

* ``plan_prices.monthly_cap_per_gpu``: the cap belongs with the model's price, effective-dated
  with it. Each existing price row takes its plan's cap; ``price_plans.monthly_cap_per_gpu``
  goes (downgrading gives each plan the largest cap of its prices back).
* ``invoices.due_at``: finalization plus the customer's payment terms.
* ``credit_notes`` and their own gapless ``credit_note_number_counters``; a trigger makes a
  credit note immutable (only the Stripe mirror columns may change, nothing is deleted).
* Changed-at markers billing compares to an invoice's ``finalized_at`` (corrections beyond
  late telemetry): ``rentals.changed_at``, ``gpu_assignments.changed_at`` and
  ``gpu_maintenance_windows.created_at``; existing rows get the migration's time.

Revision ID: 0008
Revises: 0007 (0006 in the brief; 0009 and 0007 reached main first)
Create Date: 2026-12-01 20:15:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_MARKERS = [
    ("rentals", "changed_at"),
    ("gpu_assignments", "changed_at"),
    ("gpu_maintenance_windows", "created_at"),
]

CREDIT_NOTE_TRIGGER = """
CREATE FUNCTION credit_notes_immutable() RETURNS trigger AS $$
DECLARE
    stripe CONSTANT text[] := ARRAY['stripe_id', 'stripe_status', 'stripe_error'];
BEGIN
    IF TG_OP = 'UPDATE' AND (to_jsonb(NEW) - stripe) = (to_jsonb(OLD) - stripe) THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'credit note % is immutable: only the Stripe columns may change',
        OLD.number USING ERRCODE = 'restrict_violation';
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER credit_notes_immutable BEFORE UPDATE OR DELETE ON credit_notes
    FOR EACH ROW EXECUTE FUNCTION credit_notes_immutable();
"""


def upgrade() -> None:
    op.add_column(
        "plan_prices",
        sa.Column("monthly_cap_per_gpu", sa.Numeric(precision=28, scale=10), nullable=True),
    )
    op.create_check_constraint(
        op.f("ck_plan_prices_cap_positive"),
        "plan_prices",
        "monthly_cap_per_gpu IS NULL OR monthly_cap_per_gpu > 0",
    )
    op.execute(
        "UPDATE plan_prices SET monthly_cap_per_gpu = p.monthly_cap_per_gpu "
        "FROM price_plans p WHERE p.id = plan_prices.plan_id"
    )
    op.drop_constraint(op.f("ck_price_plans_cap_positive"), "price_plans", type_="check")
    op.drop_column("price_plans", "monthly_cap_per_gpu")
    op.add_column("invoices", sa.Column("due_at", sa.DateTime(timezone=True), nullable=True))
    op.create_table(
        "credit_note_number_counters",
        sa.Column("year", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("last_number", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("year", name=op.f("pk_credit_note_number_counters")),
    )
    op.create_table(
        "credit_notes",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("customer_id", sa.Uuid(), nullable=False),
        sa.Column("number", sa.String(length=32), nullable=False),
        sa.Column("invoice_id", sa.Uuid(), nullable=False),
        sa.Column("issued_with_invoice_id", sa.Uuid(), nullable=False),
        sa.Column("currency", sa.String(length=3), nullable=False),
        sa.Column("amount", sa.Numeric(precision=28, scale=10), nullable=False),
        sa.Column("tax_rate", sa.Numeric(precision=7, scale=6), nullable=False),
        sa.Column("tax", sa.Numeric(precision=28, scale=10), nullable=False),
        sa.Column("total", sa.Numeric(precision=28, scale=10), nullable=False),
        sa.Column("reason", sa.String(length=500), nullable=False),
        sa.Column("issued_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("stripe_id", sa.String(length=255), nullable=True),
        sa.Column("stripe_status", sa.String(length=32), nullable=True),
        sa.Column("stripe_error", sa.String(length=2000), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.CheckConstraint("amount > 0", name=op.f("ck_credit_notes_amount_positive")),
        sa.ForeignKeyConstraint(
            ["customer_id"], ["customers.id"], name=op.f("fk_credit_notes_customer_id_customers")
        ),
        sa.ForeignKeyConstraint(
            ["invoice_id"], ["invoices.id"], name=op.f("fk_credit_notes_invoice_id_invoices")
        ),
        sa.ForeignKeyConstraint(
            ["issued_with_invoice_id"],
            ["invoices.id"],
            name=op.f("fk_credit_notes_issued_with_invoice_id_invoices"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_credit_notes")),
        sa.UniqueConstraint("number", name=op.f("uq_credit_notes_number")),
        sa.UniqueConstraint("stripe_id", name=op.f("uq_credit_notes_stripe_id")),
    )
    op.create_index(
        op.f("ix_credit_notes_customer_id"), "credit_notes", ["customer_id"], unique=False
    )
    op.create_index(
        op.f("ix_credit_notes_invoice_id"), "credit_notes", ["invoice_id"], unique=False
    )
    op.create_index(
        "ix_credit_notes_stripe_pending",
        "credit_notes",
        ["id"],
        unique=False,
        postgresql_where=sa.text("stripe_id IS NULL"),
    )
    op.execute(CREDIT_NOTE_TRIGGER)
    for table, column in _MARKERS:
        op.add_column(
            table,
            sa.Column(
                column,
                sa.DateTime(timezone=True),
                server_default=sa.text("now()"),
                nullable=False,
            ),
        )


def downgrade() -> None:
    for table, column in _MARKERS:
        op.drop_column(table, column)
    op.execute("DROP TRIGGER credit_notes_immutable ON credit_notes")
    op.execute("DROP FUNCTION credit_notes_immutable()")
    op.drop_table("credit_notes")
    op.drop_table("credit_note_number_counters")
    op.drop_column("invoices", "due_at")
    op.add_column(
        "price_plans",
        sa.Column("monthly_cap_per_gpu", sa.Numeric(precision=28, scale=10), nullable=True),
    )
    op.create_check_constraint(
        op.f("ck_price_plans_cap_positive"),
        "price_plans",
        "monthly_cap_per_gpu IS NULL OR monthly_cap_per_gpu > 0",
    )
    op.execute(
        "UPDATE price_plans SET monthly_cap_per_gpu = ("
        "SELECT max(monthly_cap_per_gpu) FROM plan_prices WHERE plan_id = price_plans.id)"
    )
    op.drop_constraint(op.f("ck_plan_prices_cap_positive"), "plan_prices", type_="check")
    op.drop_column("plan_prices", "monthly_cap_per_gpu")
