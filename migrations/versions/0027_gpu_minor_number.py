"""GPU identity on its node: each GPU's device minor number (/dev/nvidia<minor>), as its agent
reports it, so a scheduler's device files (Slurm's gres.conf File=) name the GPU a job got,
whatever order NVML numbers GPUs in

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-07 18:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0027"
down_revision: str | None = "0026"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("gpus", sa.Column("minor_number", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    op.drop_column("gpus", "minor_number")
