"""signed-out sessions: a dashboard session ended by sign-out is refused on the server

The session cookie is signed and stateless; signing out records its id until it would have
expired, so a copied cookie stops working. Expired rows are deleted at each sign-out.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-07 15:10:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0023"
down_revision: str | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "signed_out_sessions",
        sa.Column("session_id", sa.Uuid(), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("session_id", name=op.f("pk_signed_out_sessions")),
    )
    op.create_index(
        op.f("ix_signed_out_sessions_expires_at"), "signed_out_sessions", ["expires_at"]
    )


def downgrade() -> None:
    op.drop_table("signed_out_sessions")
