"""degraded migration and stall credit: a plan's spare policy for degraded GPUs, its stall
switch, and what started a failover

price_plans.migrate_degraded_after_s / migrate_degraded_causes: a rented GPU degraded this
long by one of these causes (app.metering.causes) is failed over to a spare (NULL: never).
price_plans.credit_stall: a failure credits the rental's other GPUs until the job runs again.
failovers.trigger: 'failed' (the GPU failed) or 'degraded' (the plan's policy moved it);
failovers.degraded_causes: the causes that did it.

Revision ID: 0025
Revises: 0023
Create Date: 2026-12-07 15:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0025"
down_revision: str | None = "0023"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Constant defaults: Postgres adds these columns without rewriting a row.
    op.add_column(
        "price_plans",
        sa.Column("credit_stall", sa.Boolean(), nullable=False, server_default=sa.true()),
    )
    op.add_column("price_plans", sa.Column("migrate_degraded_after_s", sa.BigInteger()))
    op.add_column(
        "price_plans",
        sa.Column(
            "migrate_degraded_causes",
            JSONB(),
            nullable=False,
            server_default=sa.text("'[]'::jsonb"),
        ),
    )
    op.create_check_constraint(
        op.f("ck_price_plans_degraded_after_range"),
        "price_plans",
        "migrate_degraded_after_s IS NULL OR migrate_degraded_after_s BETWEEN 1 AND 86400",
    )
    op.add_column(
        "failovers",
        sa.Column("trigger", sa.String(16), nullable=False, server_default="failed"),
    )
    op.add_column(
        "failovers",
        sa.Column(
            "degraded_causes", JSONB(), nullable=False, server_default=sa.text("'[]'::jsonb")
        ),
    )
    op.create_check_constraint(
        op.f("ck_failovers_known_trigger"), "failovers", "trigger IN ('failed', 'degraded')"
    )


def downgrade() -> None:
    op.drop_constraint(op.f("ck_failovers_known_trigger"), "failovers")
    op.drop_column("failovers", "degraded_causes")
    op.drop_column("failovers", "trigger")
    op.drop_constraint(op.f("ck_price_plans_degraded_after_range"), "price_plans")
    op.drop_column("price_plans", "migrate_degraded_causes")
    op.drop_column("price_plans", "migrate_degraded_after_s")
    op.drop_column("price_plans", "credit_stall")
