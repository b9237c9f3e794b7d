"""unsummarised hours: closed minute-metric hours whose idle floor is not yet computed

At an hour's turn ingest closes every GPU's open row in SQL, raw and with util_min_tenths = -1
(app.metering.idle.UNSUMMARISED); a periodic job deflates those rows and stores their floor.
This partial index finds them without scanning the month's partition; it holds only them.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-07 10:20:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_gpu_minute_metrics_unsummarised",
        "gpu_minute_metrics",
        ["hour"],
        postgresql_where=sa.text("util_min_tenths = -1"),
    )


def downgrade() -> None:
    op.drop_index("ix_gpu_minute_metrics_unsummarised", "gpu_minute_metrics")
