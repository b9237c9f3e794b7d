"""failover: failovers (reserved spares, their answers), hot-spare policies per model and
datacenter, preemptible rentals and their prices

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01 23:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "spare_policies",
        sa.Column("datacenter", sa.String(length=100), nullable=False),
        sa.Column("model", sa.String(length=100), nullable=False),
        sa.Column("target_percent", sa.Numeric(precision=5, scale=2), nullable=False),
        sa.Column("min_count", sa.BigInteger(), nullable=False),
        sa.Column("below_target", sa.Boolean(), nullable=False),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.CheckConstraint("min_count >= 0", name=op.f("ck_spare_policies_min_count_not_negative")),
        sa.CheckConstraint(
            "target_percent >= 0 AND target_percent <= 100",
            name=op.f("ck_spare_policies_percent_range"),
        ),
        sa.PrimaryKeyConstraint("datacenter", "model", name=op.f("pk_spare_policies")),
    )
    op.create_table(
        "failovers",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("rental_id", sa.Uuid(), nullable=False),
        sa.Column("customer_id", sa.Uuid(), nullable=False),
        sa.Column("failed_gpu_uuid", sa.String(length=96), nullable=False),
        sa.Column("spare_gpu_uuid", sa.String(length=96), nullable=True),
        sa.Column("datacenter", sa.String(length=100), nullable=False),
        sa.Column("model", sa.String(length=100), nullable=False),
        sa.Column("topology_group", sa.String(length=100), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("failed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("detected_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("requested_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("reserved_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("resumed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("closed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("migration_id", sa.BigInteger(), nullable=True),
        sa.Column("preempted_rental_id", sa.Uuid(), nullable=True),
        sa.Column("evidence", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("reason", sa.String(length=500), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.CheckConstraint(
            "spare_gpu_uuid IS NOT NULL OR state IN ('no_spare', 'recovered', 'abandoned')",
            name=op.f("ck_failovers_spare_unless_none"),
        ),
        sa.CheckConstraint(
            "state IN ('requested', 'no_spare', 'resumed', 'abandoned', 'expired', 'recovered')",
            name=op.f("ck_failovers_known_state"),
        ),
        sa.ForeignKeyConstraint(
            ["customer_id"], ["customers.id"], name=op.f("fk_failovers_customer_id_customers")
        ),
        sa.ForeignKeyConstraint(
            ["failed_gpu_uuid"], ["gpus.uuid"], name=op.f("fk_failovers_failed_gpu_uuid_gpus")
        ),
        sa.ForeignKeyConstraint(
            ["migration_id"],
            ["rental_migrations.id"],
            name=op.f("fk_failovers_migration_id_rental_migrations"),
        ),
        sa.ForeignKeyConstraint(
            ["preempted_rental_id"],
            ["rentals.id"],
            name=op.f("fk_failovers_preempted_rental_id_rentals"),
        ),
        sa.ForeignKeyConstraint(
            ["rental_id"], ["rentals.id"], name=op.f("fk_failovers_rental_id_rentals")
        ),
        sa.ForeignKeyConstraint(
            ["spare_gpu_uuid"], ["gpus.uuid"], name=op.f("fk_failovers_spare_gpu_uuid_gpus")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_failovers")),
    )
    op.create_index(op.f("ix_failovers_customer_id"), "failovers", ["customer_id"], unique=False)
    op.create_index(op.f("ix_failovers_rental_id"), "failovers", ["rental_id"], unique=False)
    op.create_index("ix_failovers_site", "failovers", ["datacenter", "model"], unique=False)
    op.create_index(
        "uq_failovers_open_failed_gpu",
        "failovers",
        ["failed_gpu_uuid"],
        unique=True,
        postgresql_where=sa.text("state IN ('requested', 'no_spare')"),
    )
    op.create_index(
        "uq_failovers_reserved_spare",
        "failovers",
        ["spare_gpu_uuid"],
        unique=True,
        postgresql_where=sa.text("state = 'requested'"),
    )
    op.add_column(
        "plan_prices",
        sa.Column("preemptible_price_per_hour", sa.Numeric(precision=28, scale=10), nullable=True),
    )
    op.add_column(
        "rentals", sa.Column("preemptible", sa.Boolean(), server_default="false", nullable=False)
    )
    op.add_column("rentals", sa.Column("preempted_at", sa.DateTime(timezone=True), nullable=True))
    op.create_check_constraint(
        op.f("ck_plan_prices_preemptible_price_not_negative"),
        "plan_prices",
        "preemptible_price_per_hour IS NULL OR preemptible_price_per_hour >= 0",
    )


def downgrade() -> None:
    op.drop_column("rentals", "preempted_at")
    op.drop_column("rentals", "preemptible")
    op.drop_constraint(
        op.f("ck_plan_prices_preemptible_price_not_negative"), "plan_prices", type_="check"
    )
    op.drop_column("plan_prices", "preemptible_price_per_hour")
    op.drop_index(
        "uq_failovers_reserved_spare",
        table_name="failovers",
        postgresql_where=sa.text("state = 'requested'"),
    )
    op.drop_index(
        "uq_failovers_open_failed_gpu",
        table_name="failovers",
        postgresql_where=sa.text("state IN ('requested', 'no_spare')"),
    )
    op.drop_index("ix_failovers_site", table_name="failovers")
    op.drop_index(op.f("ix_failovers_rental_id"), table_name="failovers")
    op.drop_index(op.f("ix_failovers_customer_id"), table_name="failovers")
    op.drop_table("failovers")
    op.drop_table("spare_policies")
