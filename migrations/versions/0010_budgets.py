"""budgets: monthly budgets with thresholds, and the thresholds crossed per period

Revision ID: 0010
Revises: 0009a
Create Date: 2026-12-01 21:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0010"
down_revision: str | None = "0009a"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "budgets",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("customer_id", sa.Uuid(), nullable=False),
        sa.Column("rental_id", sa.Uuid(), nullable=True),
        sa.Column("amount", sa.Numeric(28, 10), nullable=False),
        sa.Column("currency", sa.String(3), nullable=False),
        sa.Column("thresholds", postgresql.JSONB(), nullable=False),
        sa.Column("hard_limit", sa.Boolean(), nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.CheckConstraint("amount > 0", name=op.f("ck_budgets_amount_positive")),
        sa.ForeignKeyConstraint(
            ["customer_id"], ["customers.id"], name=op.f("fk_budgets_customer_id_customers")
        ),
        sa.ForeignKeyConstraint(
            ["rental_id"], ["rentals.id"], name=op.f("fk_budgets_rental_id_rentals")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_budgets")),
    )
    op.create_index(op.f("ix_budgets_customer_id"), "budgets", ["customer_id"])
    op.create_table(
        "budget_crossings",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("budget_id", sa.Uuid(), nullable=False),
        sa.Column("period", sa.String(7), nullable=False),
        sa.Column("basis", sa.String(16), nullable=False),
        sa.Column("percent", sa.BigInteger(), nullable=False),
        sa.Column("spend", sa.Numeric(28, 10), nullable=False),
        sa.Column("crossed_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["budget_id"],
            ["budgets.id"],
            name=op.f("fk_budget_crossings_budget_id_budgets"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_budget_crossings")),
        sa.UniqueConstraint(
            "budget_id",
            "period",
            "basis",
            "percent",
            name=op.f("uq_budget_crossings_budget_id_period_basis_percent"),
        ),
    )


def downgrade() -> None:
    op.drop_table("budget_crossings")
    op.drop_index(op.f("ix_budgets_customer_id"), table_name="budgets")
    op.drop_table("budgets")
