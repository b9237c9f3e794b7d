"""usage rollup spans: stored rollups cover the open day's closed hours too, so each stored
span (a closed local day or an hour of the open day) keeps its end beside its fingerprint

The table is a derived cache, rebuilt from the inputs: its rows (and the parts they vouch for)
are dropped here and stored again by the next read or the hourly rollup job.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-04 19:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("DELETE FROM usage_rollups")
    op.drop_table("usage_rollup_days")
    _create_spans("usage_rollup_spans", "start", with_end=True)


def downgrade() -> None:
    op.execute("DELETE FROM usage_rollups")
    op.drop_table("usage_rollup_spans")
    _create_spans("usage_rollup_days", "day", with_end=False)


def _create_spans(table: str, key: str, *, with_end: bool) -> None:
    end = [sa.Column("end", sa.BigInteger(), nullable=False)] if with_end else []
    op.create_table(
        table,
        sa.Column("customer_id", sa.Uuid(), nullable=False),
        sa.Column(key, sa.BigInteger(), autoincrement=False, nullable=False),
        *end,
        sa.Column("fingerprint", sa.BigInteger(), nullable=False),
        sa.Column(
            "rated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.ForeignKeyConstraint(
            ["customer_id"], ["customers.id"], name=op.f(f"fk_{table}_customer_id_customers")
        ),
        sa.PrimaryKeyConstraint("customer_id", key, name=op.f(f"pk_{table}")),
    )
