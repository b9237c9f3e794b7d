"""telemetry partitions: segments, closed minute metrics and health events by month

Each table is rebuilt as a range-partitioned table on its time column (monthly partitions and
a default partition; ``app.metering.retention`` names and creates them, here and in its job),
its rows copied over. Primary keys must include the partition key: segments (gpu_uuid, start)
and metrics (gpu_uuid, hour) already do; health events become (gpu_uuid, event_id, at).
Packed slots stay in their row (STORAGE MAIN), in the closed and the open table.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01 23:30:00
"""

from collections.abc import Sequence

from alembic import op
from sqlalchemy import text

from app.metering import retention

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The columns of each table, in order (both shapes have the same), and its indexes.
COLUMNS = {
    "gpu_state_segments": 'gpu_uuid, start, "end", state, evidence, received_at',
    "gpu_minute_metrics": "gpu_uuid, hour, mem_total_mib, slots, util_min_tenths",
    "health_events": "event_id, gpu_uuid, at, kind, code, state, rule, detail, received_at",
}
INDEXES = {
    "gpu_state_segments": ["pk_gpu_state_segments", "ix_gpu_state_segments_failed_start"],
    "gpu_minute_metrics": ["pk_gpu_minute_metrics"],
    "health_events": ["pk_health_events", "ix_health_events_gpu_at"],
}
DEFINITIONS = {
    "gpu_state_segments": """
        gpu_uuid VARCHAR(96) NOT NULL, start BIGINT NOT NULL, "end" BIGINT NOT NULL,
        state VARCHAR(16) NOT NULL, evidence JSONB,
        received_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
        CONSTRAINT pk_gpu_state_segments PRIMARY KEY (gpu_uuid, start),
        CONSTRAINT ck_gpu_state_segments_end_after_start CHECK ("end" > start),
        CONSTRAINT fk_gpu_state_segments_gpu_uuid_gpus FOREIGN KEY (gpu_uuid)
            REFERENCES gpus (uuid)
    """,
    "gpu_minute_metrics": """
        gpu_uuid VARCHAR(96) NOT NULL, hour BIGINT NOT NULL, mem_total_mib INTEGER,
        slots BYTEA NOT NULL, util_min_tenths SMALLINT,
        CONSTRAINT pk_gpu_minute_metrics PRIMARY KEY (gpu_uuid, hour),
        CONSTRAINT fk_gpu_minute_metrics_gpu_uuid_gpus FOREIGN KEY (gpu_uuid)
            REFERENCES gpus (uuid)
    """,
    "health_events": """
        event_id VARCHAR(200) NOT NULL, gpu_uuid VARCHAR(96) NOT NULL, at BIGINT NOT NULL,
        kind VARCHAR(16) NOT NULL, code INTEGER, state VARCHAR(16), rule VARCHAR(100),
        detail JSONB NOT NULL, received_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
        CONSTRAINT pk_health_events PRIMARY KEY ({key}),
        CONSTRAINT fk_health_events_gpu_uuid_gpus FOREIGN KEY (gpu_uuid) REFERENCES gpus (uuid)
    """,
}
SECONDARY = {
    "gpu_state_segments": "CREATE INDEX ix_gpu_state_segments_failed_start "
    "ON gpu_state_segments (start) WHERE state = 'failed'",
    "health_events": "CREATE INDEX ix_health_events_gpu_at ON health_events (gpu_uuid, at)",
}
# What 0010 had: per-table storage options and the health events' key.
OLD_OPTIONS = {
    "gpu_state_segments": "WITH (fillfactor = 70)",
    "gpu_minute_metrics": "WITH (toast_tuple_target = 128)",
    "health_events": "",
}
# Slots keep the compression 0005 chose (lz4 where the server has it, else pglz).
COMPRESSION = {"l": "lz4", "p": "pglz", "": "default"}


def _keep_compression(source: str, table: str) -> None:
    method = op.get_bind().scalar(
        text(
            "SELECT attcompression::text FROM pg_attribute "
            "WHERE attrelid = CAST(:t AS regclass) AND attname = 'slots'"
        ),
        {"t": source},
    )
    op.execute(f"ALTER TABLE {table} ALTER COLUMN slots SET COMPRESSION {COMPRESSION[method]}")


def _set_aside(table: str) -> str:
    """Rename the table and its indexes out of the way; the old table's new name."""
    for index in INDEXES[table]:
        op.execute(f"ALTER INDEX {index} RENAME TO {index}_old")
    op.execute(f"ALTER TABLE {table} RENAME TO {table}_old")
    return f"{table}_old"


def _definition(table: str, *, partitioned: bool) -> str:
    key = "gpu_uuid, event_id, at" if partitioned else "gpu_uuid, event_id"
    return DEFINITIONS[table].format(key=key)


def _copy(source: str, table: str) -> None:
    op.execute(f"INSERT INTO {table} ({COLUMNS[table]}) SELECT {COLUMNS[table]} FROM {source}")
    op.execute(f"DROP TABLE {source}")


def _months_of_data(now: int) -> set[int]:
    bind = op.get_bind()
    first = now
    for spec in retention.TABLES:
        oldest = bind.scalar(text(f"SELECT min({spec.key}) FROM {spec.table}_old"))
        first = min(first, now if oldest is None else oldest)
    wanted = set(retention.months(first, now))
    for _ in range(retention.AHEAD_MONTHS):
        wanted.add(retention.next_month(max(wanted)))
    return wanted


def upgrade() -> None:
    bind = op.get_bind()
    now = int(bind.scalar(text("SELECT extract(epoch FROM now())::bigint")))
    old = {spec.table: _set_aside(spec.table) for spec in retention.TABLES}
    for spec in retention.TABLES:
        op.execute(
            f"CREATE TABLE {spec.table} ({_definition(spec.table, partitioned=True)}) "
            f"PARTITION BY RANGE ({spec.key})"
        )
        if spec.table in SECONDARY:
            op.execute(SECONDARY[spec.table])
    _keep_compression("gpu_minute_metrics_old", "gpu_minute_metrics")
    for table in ("gpu_minute_metrics", "gpu_minute_metrics_open"):
        op.execute(f"ALTER TABLE {table} ALTER COLUMN slots SET STORAGE MAIN")
    for spec in retention.TABLES:
        retention.create_default(bind, spec)
    retention.ensure_partitions(bind, _months_of_data(now), retention.Report())
    for spec in retention.TABLES:
        _copy(old[spec.table], spec.table)


def downgrade() -> None:
    for spec in retention.TABLES:
        old = _set_aside(spec.table)
        op.execute(
            f"CREATE TABLE {spec.table} ({_definition(spec.table, partitioned=False)}) "
            f"{OLD_OPTIONS[spec.table]}"
        )
        if spec.table in SECONDARY:
            op.execute(SECONDARY[spec.table])
        if spec.table == "gpu_minute_metrics":
            _keep_compression(old, spec.table)
        _copy(old, spec.table)  # dropping the partitioned table drops its partitions
    for table in ("gpu_minute_metrics", "gpu_minute_metrics_open"):
        op.execute(f"ALTER TABLE {table} ALTER COLUMN slots SET STORAGE EXTENDED")
