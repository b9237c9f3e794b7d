"""Metering: state segments, packed minute metrics, health events.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29 16:13:45.267643
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "gpu_minute_metrics",
        sa.Column("gpu_uuid", sa.String(length=96), nullable=False),
        sa.Column("hour", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("mem_total_mib", sa.Integer(), nullable=True),
        sa.Column("slots", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(
            ["gpu_uuid"], ["gpus.uuid"], name=op.f("fk_gpu_minute_metrics_gpu_uuid_gpus")
        ),
        sa.PrimaryKeyConstraint("gpu_uuid", "hour", name=op.f("pk_gpu_minute_metrics")),
    )
    op.create_table(
        "gpu_minute_metrics_open",
        sa.Column("gpu_uuid", sa.String(length=96), nullable=False),
        sa.Column("hour", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("mem_total_mib", sa.Integer(), nullable=True),
        sa.Column("slots", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(
            ["gpu_uuid"], ["gpus.uuid"], name=op.f("fk_gpu_minute_metrics_open_gpu_uuid_gpus")
        ),
        sa.PrimaryKeyConstraint("gpu_uuid", "hour", name=op.f("pk_gpu_minute_metrics_open")),
        postgresql_with={"fillfactor": 50},
    )
    op.create_table(
        "gpu_state_segments",
        sa.Column("gpu_uuid", sa.String(length=96), nullable=False),
        sa.Column("start", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("end", sa.BigInteger(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("evidence", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column(
            "received_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.CheckConstraint('"end" > start', name=op.f("ck_gpu_state_segments_end_after_start")),
        sa.ForeignKeyConstraint(
            ["gpu_uuid"], ["gpus.uuid"], name=op.f("fk_gpu_state_segments_gpu_uuid_gpus")
        ),
        sa.PrimaryKeyConstraint("gpu_uuid", "start", name=op.f("pk_gpu_state_segments")),
        postgresql_with={"fillfactor": 70},
    )
    op.create_index(
        "ix_gpu_state_segments_failed_start",
        "gpu_state_segments",
        ["start"],
        unique=False,
        postgresql_where=sa.text("state = 'failed'"),
    )
    op.create_table(
        "health_events",
        sa.Column("event_id", sa.String(length=200), nullable=False),
        sa.Column("gpu_uuid", sa.String(length=96), nullable=False),
        sa.Column("at", sa.BigInteger(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("code", sa.Integer(), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=True),
        sa.Column("rule", sa.String(length=100), nullable=True),
        sa.Column("detail", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column(
            "received_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(
            ["gpu_uuid"], ["gpus.uuid"], name=op.f("fk_health_events_gpu_uuid_gpus")
        ),
        sa.PrimaryKeyConstraint("event_id", name=op.f("pk_health_events")),
    )
    op.create_index("ix_health_events_gpu_at", "health_events", ["gpu_uuid", "at"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_health_events_gpu_at", table_name="health_events")
    op.drop_table("health_events")
    op.drop_index(
        "ix_gpu_state_segments_failed_start",
        table_name="gpu_state_segments",
        postgresql_where=sa.text("state = 'failed'"),
    )
    op.drop_table("gpu_state_segments")
    op.drop_table("gpu_minute_metrics_open")
    op.drop_table("gpu_minute_metrics")
