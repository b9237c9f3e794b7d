"""gpu disputes: a UUID clash holds the disputed GPU's reports instead of refusing batches

``gpus.disputed_at`` / ``retired_at``; ``gpu_refused_claims`` (a node an operator settled a
clash against); ``held_telemetry`` (the disputed GPU's records and events, kept as they came
until the clash is settled).

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-07 15:40:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("gpus", sa.Column("disputed_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("gpus", sa.Column("retired_at", sa.DateTime(timezone=True), nullable=True))
    op.create_table(
        "gpu_refused_claims",
        sa.Column("gpu_uuid", sa.String(96), sa.ForeignKey("gpus.uuid"), primary_key=True),
        sa.Column("node_id", sa.Uuid(), sa.ForeignKey("nodes.id"), primary_key=True),
        sa.Column("reason", sa.String(500), nullable=False),
    )
    op.create_table(
        "held_telemetry",
        sa.Column("id", sa.BigInteger(), autoincrement=True, primary_key=True),
        sa.Column("gpu_uuid", sa.String(96), sa.ForeignKey("gpus.uuid"), nullable=False),
        sa.Column("node_id", sa.Uuid(), sa.ForeignKey("nodes.id"), nullable=False),
        sa.Column("kind", sa.String(8), nullable=False),
        sa.Column("item", postgresql.JSONB(), nullable=False),
        sa.Column(
            "held_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
    )
    op.create_index("ix_held_telemetry_gpu_node", "held_telemetry", ["gpu_uuid", "node_id"])


def downgrade() -> None:
    op.drop_table("held_telemetry")
    op.drop_table("gpu_refused_claims")
    op.drop_column("gpus", "retired_at")
    op.drop_column("gpus", "disputed_at")
