"""usage rollups: rated pieces per rental, GPU and closed day, and the days' fingerprints

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01 23:10:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "usage_rollups",
        sa.Column("rental_id", sa.Uuid(), nullable=False),
        sa.Column("gpu_uuid", sa.String(96), nullable=False),
        sa.Column("start", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("end", sa.BigInteger(), nullable=False),
        sa.Column("customer_id", sa.Uuid(), nullable=False),
        sa.Column("bucket", sa.String(24), nullable=False),
        sa.Column("price_from", sa.BigInteger(), nullable=False),
        sa.Column("idle_s", sa.Integer(), nullable=False),
        sa.CheckConstraint('"end" > start', name=op.f("ck_usage_rollups_end_after_start")),
        sa.ForeignKeyConstraint(
            ["customer_id"], ["customers.id"], name=op.f("fk_usage_rollups_customer_id_customers")
        ),
        sa.PrimaryKeyConstraint("rental_id", "gpu_uuid", "start", name=op.f("pk_usage_rollups")),
    )
    op.create_index("ix_usage_rollups_customer_start", "usage_rollups", ["customer_id", "start"])
    op.create_table(
        "usage_rollup_days",
        sa.Column("customer_id", sa.Uuid(), nullable=False),
        sa.Column("day", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("fingerprint", sa.BigInteger(), nullable=False),
        sa.Column(
            "rated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.ForeignKeyConstraint(
            ["customer_id"],
            ["customers.id"],
            name=op.f("fk_usage_rollup_days_customer_id_customers"),
        ),
        sa.PrimaryKeyConstraint("customer_id", "day", name=op.f("pk_usage_rollup_days")),
    )


def downgrade() -> None:
    op.drop_table("usage_rollup_days")
    op.drop_index("ix_usage_rollups_customer_start", table_name="usage_rollups")
    op.drop_table("usage_rollups")
