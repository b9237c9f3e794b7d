"""Foundation: customers, API keys, nodes, GPUs, price plans, rentals, assignments, migrations.

Revision ID: 0001
Revises:
Create Date: 2026-11-29 16:05:39.681985
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# A GPU serves one rental at a time. btree_gist (for an EXCLUDE constraint) is not in every
# Postgres build (the embedded one lacks it), so a trigger enforces it; locking the GPU row
# serialises concurrent assignment writers of the same GPU.
ASSIGNMENT_OVERLAP_TRIGGER = """
CREATE FUNCTION gpu_assignments_no_overlap() RETURNS trigger AS $$
DECLARE
    other_rental uuid;
BEGIN
    PERFORM 1 FROM gpus WHERE uuid = NEW.gpu_uuid FOR UPDATE;
    SELECT rental_id INTO other_rental FROM gpu_assignments
     WHERE gpu_uuid = NEW.gpu_uuid AND id <> NEW.id
       AND tstzrange(start_at, end_at) && tstzrange(NEW.start_at, NEW.end_at)
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'GPU % is already assigned to rental % over an overlapping interval',
            NEW.gpu_uuid, other_rental USING ERRCODE = 'exclusion_violation';
    END IF;
    RETURN NEW;
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER gpu_assignments_no_overlap BEFORE INSERT OR UPDATE ON gpu_assignments
    FOR EACH ROW EXECUTE FUNCTION gpu_assignments_no_overlap();
"""


def upgrade() -> None:
    op.create_table(
        "customers",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("email", sa.String(length=320), nullable=True),
        sa.Column("currency", sa.String(length=3), nullable=False),
        sa.Column("billing_timezone", sa.String(length=64), nullable=False),
        sa.Column("tax_rate", sa.Numeric(precision=7, scale=6), nullable=True),
        sa.Column("stripe_customer_id", sa.String(length=255), nullable=True),
        sa.Column("collection_method", sa.String(length=32), nullable=False),
        sa.Column("days_until_due", sa.BigInteger(), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.CheckConstraint("days_until_due >= 0", name=op.f("ck_customers_days_until_due")),
        sa.CheckConstraint(
            "tax_rate IS NULL OR (tax_rate >= 0 AND tax_rate < 1)",
            name=op.f("ck_customers_tax_rate"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_customers")),
        sa.UniqueConstraint("stripe_customer_id", name=op.f("uq_customers_stripe_customer_id")),
    )
    op.create_table(
        "nodes",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("hostname", sa.String(length=253), nullable=False),
        sa.Column("datacenter", sa.String(length=100), nullable=False),
        sa.Column("topology_group", sa.String(length=100), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_nodes")),
        sa.UniqueConstraint("hostname", name=op.f("uq_nodes_hostname")),
    )
    op.create_table(
        "price_plans",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("currency", sa.String(length=3), nullable=False),
        sa.Column("increment_s", sa.BigInteger(), nullable=False),
        sa.Column("minimum_s", sa.BigInteger(), nullable=False),
        sa.Column("bill_degraded", sa.Boolean(), nullable=False),
        sa.Column("bill_unmetered", sa.Boolean(), nullable=False),
        sa.Column("monthly_cap_per_gpu", sa.Numeric(precision=28, scale=10), nullable=True),
        sa.Column("voucher_tiers", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("voucher_validity_days", sa.BigInteger(), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.CheckConstraint("increment_s >= 1", name=op.f("ck_price_plans_increment_positive")),
        sa.CheckConstraint("minimum_s >= 0", name=op.f("ck_price_plans_minimum_not_negative")),
        sa.CheckConstraint(
            "monthly_cap_per_gpu IS NULL OR monthly_cap_per_gpu > 0",
            name=op.f("ck_price_plans_cap_positive"),
        ),
        sa.CheckConstraint(
            "voucher_validity_days >= 1", name=op.f("ck_price_plans_validity_positive")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_price_plans")),
        sa.UniqueConstraint("name", name=op.f("uq_price_plans_name")),
    )
    op.create_table(
        "api_keys",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("kind", sa.Enum("admin", "customer", "node", name="key_kind"), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("prefix", sa.String(length=16), nullable=False),
        sa.Column("key_hash", sa.String(length=64), nullable=False),
        sa.Column("customer_id", sa.Uuid(), nullable=True),
        sa.Column("node_id", sa.Uuid(), nullable=True),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.CheckConstraint(
            "(kind = 'customer') = (customer_id IS NOT NULL)"
            " AND (kind = 'node') = (node_id IS NOT NULL)",
            name=op.f("ck_api_keys_owner_matches_kind"),
        ),
        sa.ForeignKeyConstraint(
            ["customer_id"],
            ["customers.id"],
            name=op.f("fk_api_keys_customer_id_customers"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["node_id"], ["nodes.id"], name=op.f("fk_api_keys_node_id_nodes"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_keys")),
        sa.UniqueConstraint("key_hash", name=op.f("uq_api_keys_key_hash")),
    )
    op.create_index(op.f("ix_api_keys_customer_id"), "api_keys", ["customer_id"], unique=False)
    op.create_index(op.f("ix_api_keys_node_id"), "api_keys", ["node_id"], unique=False)
    op.create_table(
        "gpus",
        sa.Column("uuid", sa.String(length=96), nullable=False),
        sa.Column("node_id", sa.Uuid(), nullable=False),
        sa.Column("model", sa.String(length=100), nullable=False),
        sa.Column(
            "pool", sa.Enum("rentable", "spare", "maintenance", name="gpu_pool"), nullable=False
        ),
        sa.Column("last_state", sa.String(length=16), nullable=True),
        sa.Column("last_seen_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(["node_id"], ["nodes.id"], name=op.f("fk_gpus_node_id_nodes")),
        sa.PrimaryKeyConstraint("uuid", name=op.f("pk_gpus")),
    )
    op.create_index(op.f("ix_gpus_node_id"), "gpus", ["node_id"], unique=False)
    op.create_table(
        "plan_prices",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("plan_id", sa.Uuid(), nullable=False),
        sa.Column("gpu_model", sa.String(length=100), nullable=False),
        sa.Column("price_per_hour", sa.Numeric(precision=28, scale=10), nullable=False),
        sa.Column("effective_from", sa.DateTime(timezone=True), nullable=False),
        sa.Column("customer_id", sa.Uuid(), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.CheckConstraint("price_per_hour >= 0", name=op.f("ck_plan_prices_price_not_negative")),
        sa.ForeignKeyConstraint(
            ["customer_id"],
            ["customers.id"],
            name=op.f("fk_plan_prices_customer_id_customers"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["plan_id"],
            ["price_plans.id"],
            name=op.f("fk_plan_prices_plan_id_price_plans"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_plan_prices")),
    )
    op.create_index(
        op.f("ix_plan_prices_customer_id"), "plan_prices", ["customer_id"], unique=False
    )
    op.create_index(
        "uq_plan_prices_plan_model_customer_from",
        "plan_prices",
        ["plan_id", "gpu_model", "customer_id", "effective_from"],
        unique=True,
        postgresql_nulls_not_distinct=True,
    )
    op.create_table(
        "rentals",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("customer_id", sa.Uuid(), nullable=False),
        sa.Column("plan_id", sa.Uuid(), nullable=False),
        sa.Column("gpu_model", sa.String(length=100), nullable=False),
        sa.Column("gpu_count", sa.BigInteger(), nullable=False),
        sa.Column("start_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("end_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.CheckConstraint(
            "end_at IS NULL OR end_at > start_at", name=op.f("ck_rentals_end_after_start")
        ),
        sa.CheckConstraint("gpu_count >= 1", name=op.f("ck_rentals_gpu_count_positive")),
        sa.ForeignKeyConstraint(
            ["customer_id"], ["customers.id"], name=op.f("fk_rentals_customer_id_customers")
        ),
        sa.ForeignKeyConstraint(
            ["plan_id"], ["price_plans.id"], name=op.f("fk_rentals_plan_id_price_plans")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_rentals")),
    )
    op.create_index(op.f("ix_rentals_customer_id"), "rentals", ["customer_id"], unique=False)
    op.create_table(
        "gpu_assignments",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("rental_id", sa.Uuid(), nullable=False),
        sa.Column("customer_id", sa.Uuid(), nullable=False),
        sa.Column("gpu_uuid", sa.String(length=96), nullable=False),
        sa.Column("start_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("end_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "end_at IS NULL OR end_at > start_at", name=op.f("ck_gpu_assignments_end_after_start")
        ),
        sa.ForeignKeyConstraint(
            ["customer_id"], ["customers.id"], name=op.f("fk_gpu_assignments_customer_id_customers")
        ),
        sa.ForeignKeyConstraint(
            ["gpu_uuid"], ["gpus.uuid"], name=op.f("fk_gpu_assignments_gpu_uuid_gpus")
        ),
        sa.ForeignKeyConstraint(
            ["rental_id"], ["rentals.id"], name=op.f("fk_gpu_assignments_rental_id_rentals")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_gpu_assignments")),
    )
    op.create_index(
        op.f("ix_gpu_assignments_customer_id"), "gpu_assignments", ["customer_id"], unique=False
    )
    op.create_index(
        "ix_gpu_assignments_gpu_start", "gpu_assignments", ["gpu_uuid", "start_at"], unique=False
    )
    op.create_index(
        op.f("ix_gpu_assignments_rental_id"), "gpu_assignments", ["rental_id"], unique=False
    )
    op.create_table(
        "gpu_maintenance_windows",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("gpu_uuid", sa.String(length=96), nullable=False),
        sa.Column("start_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("end_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("reason", sa.String(length=500), nullable=True),
        sa.CheckConstraint(
            "end_at IS NULL OR end_at > start_at",
            name=op.f("ck_gpu_maintenance_windows_end_after_start"),
        ),
        sa.ForeignKeyConstraint(
            ["gpu_uuid"], ["gpus.uuid"], name=op.f("fk_gpu_maintenance_windows_gpu_uuid_gpus")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_gpu_maintenance_windows")),
    )
    op.create_index(
        "ix_gpu_maintenance_windows_gpu_start",
        "gpu_maintenance_windows",
        ["gpu_uuid", "start_at"],
        unique=False,
    )
    op.create_table(
        "rental_migrations",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("rental_id", sa.Uuid(), nullable=False),
        sa.Column("customer_id", sa.Uuid(), nullable=False),
        sa.Column("from_gpu_uuid", sa.String(length=96), nullable=False),
        sa.Column("to_gpu_uuid", sa.String(length=96), nullable=False),
        sa.Column("failed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("resumed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("reason", sa.String(length=500), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.CheckConstraint(
            "from_gpu_uuid <> to_gpu_uuid", name=op.f("ck_rental_migrations_different_gpus")
        ),
        sa.CheckConstraint(
            "resumed_at >= failed_at", name=op.f("ck_rental_migrations_resumed_after_failed")
        ),
        sa.ForeignKeyConstraint(
            ["customer_id"],
            ["customers.id"],
            name=op.f("fk_rental_migrations_customer_id_customers"),
        ),
        sa.ForeignKeyConstraint(
            ["from_gpu_uuid"], ["gpus.uuid"], name=op.f("fk_rental_migrations_from_gpu_uuid_gpus")
        ),
        sa.ForeignKeyConstraint(
            ["rental_id"], ["rentals.id"], name=op.f("fk_rental_migrations_rental_id_rentals")
        ),
        sa.ForeignKeyConstraint(
            ["to_gpu_uuid"], ["gpus.uuid"], name=op.f("fk_rental_migrations_to_gpu_uuid_gpus")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_rental_migrations")),
    )
    op.create_index(
        op.f("ix_rental_migrations_customer_id"), "rental_migrations", ["customer_id"], unique=False
    )
    op.create_index(
        op.f("ix_rental_migrations_rental_id"), "rental_migrations", ["rental_id"], unique=False
    )
    op.execute(ASSIGNMENT_OVERLAP_TRIGGER)


def downgrade() -> None:
    op.execute("DROP TRIGGER gpu_assignments_no_overlap ON gpu_assignments")
    op.execute("DROP FUNCTION gpu_assignments_no_overlap()")
    op.drop_index(op.f("ix_rental_migrations_rental_id"), table_name="rental_migrations")
    op.drop_index(op.f("ix_rental_migrations_customer_id"), table_name="rental_migrations")
    op.drop_table("rental_migrations")
    op.drop_index("ix_gpu_maintenance_windows_gpu_start", table_name="gpu_maintenance_windows")
    op.drop_table("gpu_maintenance_windows")
    op.drop_index(op.f("ix_gpu_assignments_rental_id"), table_name="gpu_assignments")
    op.drop_index("ix_gpu_assignments_gpu_start", table_name="gpu_assignments")
    op.drop_index(op.f("ix_gpu_assignments_customer_id"), table_name="gpu_assignments")
    op.drop_table("gpu_assignments")
    op.drop_index(op.f("ix_rentals_customer_id"), table_name="rentals")
    op.drop_table("rentals")
    op.drop_index(
        "uq_plan_prices_plan_model_customer_from",
        table_name="plan_prices",
        postgresql_nulls_not_distinct=True,
    )
    op.drop_index(op.f("ix_plan_prices_customer_id"), table_name="plan_prices")
    op.drop_table("plan_prices")
    op.drop_index(op.f("ix_gpus_node_id"), table_name="gpus")
    op.drop_table("gpus")
    op.drop_index(op.f("ix_api_keys_node_id"), table_name="api_keys")
    op.drop_index(op.f("ix_api_keys_customer_id"), table_name="api_keys")
    op.drop_table("api_keys")
    op.drop_table("price_plans")
    op.drop_table("nodes")
    op.drop_table("customers")
    sa.Enum(name="gpu_pool").drop(op.get_bind())
    sa.Enum(name="key_kind").drop(op.get_bind())
