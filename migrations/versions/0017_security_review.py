"""security review: a quarantine pool for GPUs their node reported but no operator admitted;
webhook signing secrets encrypted at rest (Fernet tokens under the configured keys)

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-06 04:50:00
"""

from collections.abc import Callable, Sequence

import sqlalchemy as sa
from alembic import op

from app.core.crypto import decrypt, encrypt

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


SECRETS = ("secret", "previous_secret")


def upgrade() -> None:
    # Postgres 12+ adds an enum value inside a transaction (it is usable once committed).
    op.execute("ALTER TYPE gpu_pool ADD VALUE IF NOT EXISTS 'quarantine'")
    for column in SECRETS:
        op.alter_column("webhook_endpoints", column, type_=sa.String(300))
    _convert(encrypt)


def downgrade() -> None:
    # An enum value cannot be dropped: quarantined GPUs go back to rentable, the value stays.
    op.execute("UPDATE gpus SET pool = 'rentable' WHERE pool = 'quarantine'")
    _convert(decrypt)
    for column in SECRETS:
        op.alter_column("webhook_endpoints", column, type_=sa.String(100))


def _convert(how: Callable[[str], str]) -> None:
    """Every stored secret through ``how`` (encrypt on the way up, decrypt on the way down)."""
    connection = op.get_bind()
    rows = connection.execute(sa.text("SELECT id, secret, previous_secret FROM webhook_endpoints"))
    for endpoint_id, secret, previous in rows.all():
        connection.execute(
            sa.text("UPDATE webhook_endpoints SET secret = :s, previous_secret = :p WHERE id = :i"),
            {"i": endpoint_id, "s": how(secret), "p": None if previous is None else how(previous)},
        )
