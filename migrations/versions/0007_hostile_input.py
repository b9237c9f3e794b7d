"""Health events keyed by (GPU, event id); per-customer portal revocation.

An event id is only unique on the GPU whose agent made it: with the id alone as the key, a node
sending another node's id suppressed that node's event. Admins can end a customer's portal
links and dashboard sessions (``customers.portal_revoked_at``) without rotating the secret.

Revision ID: 0007
Revises: 0009 (0006 in the brief; 0009 reached main first)
Create Date: 2026-12-01 20:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.drop_constraint("pk_health_events", "health_events", type_="primary")
    op.create_primary_key("pk_health_events", "health_events", ["gpu_uuid", "event_id"])
    op.add_column("customers", sa.Column("portal_revoked_at", sa.DateTime(timezone=True)))


def downgrade() -> None:
    op.drop_column("customers", "portal_revoked_at")
    op.drop_constraint("pk_health_events", "health_events", type_="primary")
    op.create_primary_key("pk_health_events", "health_events", ["event_id"])
