"""Idle summary of closed minute-metric hours: util_min_tenths.

floor(lowest per-minute mean GPU utilisation of the hour) in tenths of a percent, computed by
the writers (app.metering.idle.util_floor_tenths). An hour holds an idle minute at an integer
threshold T exactly when it is below T, so the usage read fetches only those hours: reading
every hour of a month made the usage API take ~0.6 s for 64 GPUs. Existing rows are backfilled
from their packed slots (slot layout: app.metering.packing.SLOT, 19 bytes; utilisation count
at byte 1, sum little-endian at bytes 2-3).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-29 16:46:36
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BACKFILL = """
UPDATE gpu_minute_metrics SET util_min_tenths = (
    SELECT min(10 * (get_byte(slots, i * 19 + 2) + 256 * get_byte(slots, i * 19 + 3))
               / get_byte(slots, i * 19 + 1))
    FROM generate_series(0, 59) AS i
    WHERE get_byte(slots, i * 19 + 1) > 0
)
"""


def upgrade() -> None:
    op.add_column("gpu_minute_metrics", sa.Column("util_min_tenths", sa.SmallInteger()))
    op.execute(BACKFILL)


def downgrade() -> None:
    op.drop_column("gpu_minute_metrics", "util_min_tenths")
