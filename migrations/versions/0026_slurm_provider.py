"""slurm as a provider runs it: a scheduler key kind (the adapter's least privilege); why Slurm
cannot requeue a job (its failover is abandoned before the adapter is asked)

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-07 15:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0026"
down_revision: str | None = "0025"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Postgres 12+ adds an enum value inside a transaction (it is usable once committed).
    op.execute("ALTER TYPE key_kind ADD VALUE IF NOT EXISTS 'scheduler'")
    op.add_column("slurm_jobs", sa.Column("requeue_refusal", sa.String(200), nullable=True))


def downgrade() -> None:
    op.drop_column("slurm_jobs", "requeue_refusal")
    # An enum value cannot be dropped: scheduler keys are revoked, the value stays.
    op.execute("UPDATE api_keys SET revoked_at = now() WHERE kind = 'scheduler'")
