"""balances: the prepaid balance ledger (trial credit, top-ups, invoice applications)

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-01 23:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "balance_entries",
        sa.Column("seq", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("key", sa.String(200), nullable=False),
        sa.Column("customer_id", sa.Uuid(), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("amount_minor", sa.BigInteger(), nullable=False),
        sa.Column("balance_minor", sa.BigInteger(), nullable=False),
        sa.Column("currency", sa.String(3), nullable=False),
        sa.Column("invoice_id", sa.Uuid(), nullable=True),
        sa.Column("reason", sa.String(500), nullable=False),
        sa.Column("created_by", sa.Uuid(), nullable=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("amount_minor <> 0", name=op.f("ck_balance_entries_amount_nonzero")),
        sa.CheckConstraint("balance_minor >= 0", name=op.f("ck_balance_entries_never_negative")),
        sa.ForeignKeyConstraint(
            ["customer_id"],
            ["customers.id"],
            name=op.f("fk_balance_entries_customer_id_customers"),
        ),
        sa.PrimaryKeyConstraint("seq", name=op.f("pk_balance_entries")),
        sa.UniqueConstraint("key", name=op.f("uq_balance_entries_key")),
    )
    op.create_index("ix_balance_entries_customer_seq", "balance_entries", ["customer_id", "seq"])
    # The ledger is append-only: a movement is corrected by another entry, never edited.
    op.execute(
        """
        CREATE FUNCTION balance_entries_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            RAISE EXCEPTION 'balance_entries is append-only';
        END $$;
        CREATE TRIGGER balance_entries_append_only BEFORE UPDATE OR DELETE ON balance_entries
            FOR EACH ROW EXECUTE FUNCTION balance_entries_append_only();
        """
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER balance_entries_append_only ON balance_entries")
    op.execute("DROP FUNCTION balance_entries_append_only()")
    op.drop_index("ix_balance_entries_customer_seq", table_name="balance_entries")
    op.drop_table("balance_entries")
