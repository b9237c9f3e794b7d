"""rental names: an optional name the customer gives a rental, shown on its pages

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-07 05:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable, no default: adding it rewrites no row, and existing rentals stay unnamed.
    op.add_column("rentals", sa.Column("name", sa.String(100), nullable=True))


def downgrade() -> None:
    op.drop_column("rentals", "name")
