"""payments: the Stripe sync outbox, the webhook inbox and payment failures

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-29 16:40:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ENUMS = {
    "stripe_sync_target": ("finalized", "void"),
    "stripe_sync_state": ("pending", "synced", "failed"),
    "stripe_sync_step": ("queued", "customer", "invoice", "items", "finalized", "voided"),
}


def upgrade() -> None:
    op.create_table(
        "stripe_outbox",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("invoice_id", sa.Uuid(), nullable=False),
        sa.Column("customer_id", sa.Uuid(), nullable=False),
        sa.Column(
            "target",
            sa.Enum(*ENUMS["stripe_sync_target"], name="stripe_sync_target"),
            nullable=False,
        ),
        sa.Column(
            "state", sa.Enum(*ENUMS["stripe_sync_state"], name="stripe_sync_state"), nullable=False
        ),
        sa.Column(
            "step", sa.Enum(*ENUMS["stripe_sync_step"], name="stripe_sync_step"), nullable=False
        ),
        sa.Column("items_created", sa.Integer(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column(
            "next_attempt_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("lease_owner", sa.String(length=64), nullable=True),
        sa.Column("leased_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_error", sa.String(length=2000), nullable=True),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("synced_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(
            ["customer_id"], ["customers.id"], name=op.f("fk_stripe_outbox_customer_id_customers")
        ),
        sa.ForeignKeyConstraint(
            ["invoice_id"], ["invoices.id"], name=op.f("fk_stripe_outbox_invoice_id_invoices")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_stripe_outbox")),
        sa.UniqueConstraint("invoice_id", name=op.f("uq_stripe_outbox_invoice_id")),
    )
    op.create_index(op.f("ix_stripe_outbox_customer_id"), "stripe_outbox", ["customer_id"])
    op.create_index(
        "ix_stripe_outbox_due",
        "stripe_outbox",
        ["next_attempt_at"],
        postgresql_where=sa.text("state = 'pending'"),
    )
    op.create_table(
        "stripe_webhook_events",
        sa.Column("id", sa.String(length=255), nullable=False),
        sa.Column("type", sa.String(length=100), nullable=False),
        sa.Column("stripe_object_id", sa.String(length=255), nullable=True),
        sa.Column("invoice_id", sa.Uuid(), nullable=True),
        sa.Column("payload", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("outcome", sa.String(length=32), nullable=False),
        sa.Column(
            "received_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(
            ["invoice_id"],
            ["invoices.id"],
            name=op.f("fk_stripe_webhook_events_invoice_id_invoices"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_stripe_webhook_events")),
    )
    op.create_index(
        op.f("ix_stripe_webhook_events_invoice_id"), "stripe_webhook_events", ["invoice_id"]
    )
    op.create_table(
        "stripe_payment_failures",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("event_id", sa.String(length=255), nullable=False),
        sa.Column("invoice_id", sa.Uuid(), nullable=False),
        sa.Column("customer_id", sa.Uuid(), nullable=False),
        sa.Column("stripe_invoice_id", sa.String(length=255), nullable=False),
        sa.Column("amount_due", sa.Numeric(precision=28, scale=10), nullable=False),
        sa.Column("currency", sa.String(length=3), nullable=False),
        sa.Column("attempt_count", sa.Integer(), nullable=False),
        sa.Column("next_payment_attempt", sa.DateTime(timezone=True), nullable=True),
        sa.Column("occurred_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["customer_id"],
            ["customers.id"],
            name=op.f("fk_stripe_payment_failures_customer_id_customers"),
        ),
        sa.ForeignKeyConstraint(
            ["event_id"],
            ["stripe_webhook_events.id"],
            name=op.f("fk_stripe_payment_failures_event_id_stripe_webhook_events"),
        ),
        sa.ForeignKeyConstraint(
            ["invoice_id"],
            ["invoices.id"],
            name=op.f("fk_stripe_payment_failures_invoice_id_invoices"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_stripe_payment_failures")),
        sa.UniqueConstraint("event_id", name=op.f("uq_stripe_payment_failures_event_id")),
    )
    op.create_index(
        op.f("ix_stripe_payment_failures_customer_id"), "stripe_payment_failures", ["customer_id"]
    )
    op.create_index(
        op.f("ix_stripe_payment_failures_invoice_id"), "stripe_payment_failures", ["invoice_id"]
    )


def downgrade() -> None:
    op.drop_table("stripe_payment_failures")
    op.drop_table("stripe_webhook_events")
    op.drop_table("stripe_outbox")
    for name in ENUMS:
        sa.Enum(name=name).drop(op.get_bind())
