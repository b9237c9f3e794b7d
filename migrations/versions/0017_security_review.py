"""security review: a quarantine pool for GPUs their node reported but no operator admitted

Revision ID: 0017
Revises: 0015
Create Date: 2026-12-06 04:50:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0017"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Postgres 12+ adds an enum value inside a transaction (it is usable once committed).
    op.execute("ALTER TYPE gpu_pool ADD VALUE IF NOT EXISTS 'quarantine'")


def downgrade() -> None:
    # An enum value cannot be dropped: quarantined GPUs go back to rentable, the value stays.
    op.execute("UPDATE gpus SET pool = 'rentable' WHERE pool = 'quarantine'")
