"""webhooks: endpoints, one delivery per event and endpoint, the attempts log; the scheduled
invoice runs

Revision ID: 0009a
Revises: 0008
Create Date: 2026-12-01 20:50:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0009a"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

STATUS = sa.Enum("pending", "succeeded", "failed", name="webhook_delivery_status")
RUN_STATUS = sa.Enum("pending", "succeeded", "failed", name="scheduled_run_status")


def _now() -> sa.TextClause:
    return sa.text("now()")


def upgrade() -> None:
    op.create_table(
        "webhook_endpoints",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("url", sa.String(length=2000), nullable=False),
        sa.Column("description", sa.String(length=500), nullable=True),
        sa.Column("event_types", sa.ARRAY(sa.String(length=100)), nullable=False),
        sa.Column("customer_id", sa.Uuid(), nullable=True),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("secret", sa.String(length=100), nullable=False),
        sa.Column("previous_secret", sa.String(length=100), nullable=True),
        sa.Column("previous_secret_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("failure_streak", sa.Integer(), nullable=False),
        sa.Column("failing_since", sa.DateTime(timezone=True), nullable=True),
        sa.Column("disabled_reason", sa.String(length=500), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=_now(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=_now(), nullable=False),
        sa.ForeignKeyConstraint(
            ["customer_id"],
            ["customers.id"],
            name=op.f("fk_webhook_endpoints_customer_id_customers"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhook_endpoints")),
    )
    op.create_index(op.f("ix_webhook_endpoints_customer_id"), "webhook_endpoints", ["customer_id"])
    op.create_table(
        "webhook_deliveries",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("endpoint_id", sa.Uuid(), nullable=False),
        sa.Column("event_id", sa.Uuid(), nullable=False),
        sa.Column("status", STATUS, nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column(
            "retrying_since", sa.DateTime(timezone=True), server_default=_now(), nullable=False
        ),
        sa.Column(
            "next_attempt_at", sa.DateTime(timezone=True), server_default=_now(), nullable=True
        ),
        sa.Column("last_status_code", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.String(length=500), nullable=True),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=_now(), nullable=False),
        sa.ForeignKeyConstraint(
            ["endpoint_id"],
            ["webhook_endpoints.id"],
            name=op.f("fk_webhook_deliveries_endpoint_id_webhook_endpoints"),
        ),
        sa.ForeignKeyConstraint(
            ["event_id"], ["events.id"], name=op.f("fk_webhook_deliveries_event_id_events")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhook_deliveries")),
        sa.UniqueConstraint(
            "endpoint_id", "event_id", name=op.f("uq_webhook_deliveries_endpoint_id_event_id")
        ),
    )
    op.create_index(op.f("ix_webhook_deliveries_event_id"), "webhook_deliveries", ["event_id"])
    op.create_index(
        "ix_webhook_deliveries_endpoint_id_id", "webhook_deliveries", ["endpoint_id", "id"]
    )
    op.create_index(
        "ix_webhook_deliveries_pending",
        "webhook_deliveries",
        ["status"],
        postgresql_where=sa.text("status = 'pending'"),
    )
    op.create_table(
        "webhook_attempts",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("delivery_id", sa.BigInteger(), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("error", sa.String(length=500), nullable=True),
        sa.Column("duration_ms", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["delivery_id"],
            ["webhook_deliveries.id"],
            name=op.f("fk_webhook_attempts_delivery_id_webhook_deliveries"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhook_attempts")),
    )
    op.create_index(op.f("ix_webhook_attempts_delivery_id"), "webhook_attempts", ["delivery_id"])
    op.create_table(
        "scheduled_invoice_runs",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("period", sa.String(length=7), nullable=False),
        sa.Column("timezone", sa.String(length=64), nullable=False),
        sa.Column("status", RUN_STATUS, nullable=False),
        sa.Column("finalize", sa.Boolean(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("customers", sa.Integer(), nullable=False),
        sa.Column("counts", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("failures", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("error", sa.String(length=2000), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=_now(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_scheduled_invoice_runs")),
        sa.UniqueConstraint(
            "period", "timezone", name=op.f("uq_scheduled_invoice_runs_period_timezone")
        ),
    )


def downgrade() -> None:
    op.drop_table("scheduled_invoice_runs")
    RUN_STATUS.drop(op.get_bind())
    op.drop_table("webhook_attempts")
    op.drop_table("webhook_deliveries")
    op.drop_table("webhook_endpoints")
    STATUS.drop(op.get_bind())
