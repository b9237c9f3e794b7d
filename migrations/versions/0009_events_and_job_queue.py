"""events: the domain-event outbox; the job queue: procrastinate's own schema

procrastinate's tables, types and functions come from the installed library's schema SQL
(pyproject pins its minor version, so this revision always builds the same schema). A later
procrastinate release ships delta scripts in ``procrastinate/sql/migrations``; bumping the pin
means adding a revision that runs them.

Revision ID: 0009
Revises: 0006
Create Date: 2026-12-01 20:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from procrastinate.schema import SchemaManager
from sqlalchemy.dialects import postgresql

revision: str = "0009"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

DROP_PROCRASTINATE = """
DO $$
DECLARE item record;
BEGIN
    FOR item IN SELECT tablename FROM pg_tables
                WHERE schemaname = current_schema() AND tablename LIKE 'procrastinate%' LOOP
        EXECUTE format('DROP TABLE %I CASCADE', item.tablename);
    END LOOP;
    FOR item IN SELECT p.oid::regprocedure AS signature FROM pg_proc p
                JOIN pg_namespace n ON n.oid = p.pronamespace
                WHERE n.nspname = current_schema() AND p.proname LIKE 'procrastinate%' LOOP
        EXECUTE format('DROP FUNCTION %s CASCADE', item.signature);
    END LOOP;
    FOR item IN SELECT t.typname FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
                WHERE n.nspname = current_schema() AND t.typname LIKE 'procrastinate%'
                  AND t.typtype IN ('e', 'c') LOOP
        EXECUTE format('DROP TYPE IF EXISTS %I CASCADE', item.typname);
    END LOOP;
END $$;
"""


def _run_raw(sql: str) -> None:
    """Run SQL as is on the migration's own connection (no bind-parameter parsing of ``%``)."""
    op.get_bind().connection.driver_connection.execute(sql)  # type: ignore[union-attr]


def upgrade() -> None:
    op.create_table(
        "events",
        sa.Column("seq", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("type", sa.String(length=100), nullable=False),
        sa.Column(
            "occurred_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("subject", sa.String(length=200), nullable=False),
        sa.Column("customer_id", sa.Uuid(), nullable=True),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("data", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.PrimaryKeyConstraint("seq", name=op.f("pk_events")),
        sa.UniqueConstraint("id", name=op.f("uq_events_id")),
    )
    op.create_index("ix_events_type_seq", "events", ["type", "seq"])
    op.create_index("ix_events_customer_seq", "events", ["customer_id", "seq"])
    op.create_index("ix_events_occurred_at", "events", ["occurred_at"])
    _run_raw(SchemaManager.get_schema())


def downgrade() -> None:
    _run_raw(DROP_PROCRASTINATE)
    op.drop_table("events")
