"""slurm: GPUs carry their device index on the node; Slurm accounts map to customers, jobs
to rentals, and failovers and repairs to actions for the Slurm adapter (issue 31)

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-06 03:45:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NAME = sa.String(64)
NOW = sa.text("now()")


def upgrade() -> None:
    op.add_column("gpus", sa.Column("device_index", sa.BigInteger(), nullable=True))
    op.create_table(
        "slurm_accounts",
        sa.Column("account", NAME, nullable=False),
        sa.Column("customer_id", sa.Uuid(), nullable=False),
        sa.Column("plan_id", sa.Uuid(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=NOW, nullable=False),
        sa.ForeignKeyConstraint(
            ["customer_id"], ["customers.id"], name=op.f("fk_slurm_accounts_customer_id_customers")
        ),
        sa.ForeignKeyConstraint(
            ["plan_id"], ["price_plans.id"], name=op.f("fk_slurm_accounts_plan_id_price_plans")
        ),
        sa.PrimaryKeyConstraint("account", name=op.f("pk_slurm_accounts")),
    )
    op.create_index(
        op.f("ix_slurm_accounts_customer_id"), "slurm_accounts", ["customer_id"], unique=False
    )
    op.create_table(
        "slurm_jobs",
        sa.Column("cluster", NAME, nullable=False),
        sa.Column("job_id", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("account", NAME, nullable=False),
        sa.Column("rental_id", sa.Uuid(), nullable=True),
        sa.Column("state", sa.String(32), nullable=False),
        sa.Column("restarts", sa.BigInteger(), nullable=False),
        sa.Column("run_start_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("nodes", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("last_seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("problem", sa.String(500), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=NOW, nullable=False),
        sa.ForeignKeyConstraint(
            ["rental_id"], ["rentals.id"], name=op.f("fk_slurm_jobs_rental_id_rentals")
        ),
        sa.PrimaryKeyConstraint("cluster", "job_id", name=op.f("pk_slurm_jobs")),
        sa.UniqueConstraint("rental_id", name=op.f("uq_slurm_jobs_rental_id")),
    )
    op.execute("CREATE TYPE slurm_action_kind AS ENUM ('failover', 'repair')")
    op.create_table(
        "slurm_actions",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column(
            "kind",
            postgresql.ENUM("failover", "repair", name="slurm_action_kind", create_type=False),
            nullable=False,
        ),
        sa.Column("cluster", NAME, nullable=False),
        sa.Column("node", NAME, nullable=False),
        sa.Column("failover_id", sa.Uuid(), nullable=True),
        sa.Column("job_id", sa.BigInteger(), nullable=True),
        sa.Column("spare_node", NAME, nullable=True),
        sa.Column("nodes_after", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("restarts_before", sa.BigInteger(), nullable=True),
        sa.Column("reason", sa.String(500), nullable=False),
        sa.Column("done_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("outcome", sa.String(500), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=NOW, nullable=False),
        sa.CheckConstraint(
            "kind <> 'failover' OR (failover_id IS NOT NULL AND job_id IS NOT NULL)",
            name=op.f("ck_slurm_actions_failover_has_job"),
        ),
        sa.ForeignKeyConstraint(
            ["failover_id"], ["failovers.id"], name=op.f("fk_slurm_actions_failover_id_failovers")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_slurm_actions")),
    )
    op.create_index("uq_slurm_actions_failover", "slurm_actions", ["failover_id"], unique=True)
    op.create_index(
        "uq_slurm_actions_open_repair",
        "slurm_actions",
        ["cluster", "node"],
        unique=True,
        postgresql_where=sa.text("kind = 'repair' AND done_at IS NULL"),
    )


def downgrade() -> None:
    op.drop_table("slurm_actions")
    op.execute("DROP TYPE slurm_action_kind")
    op.drop_table("slurm_jobs")
    op.drop_index(op.f("ix_slurm_accounts_customer_id"), table_name="slurm_accounts")
    op.drop_table("slurm_accounts")
    op.drop_column("gpus", "device_index")
