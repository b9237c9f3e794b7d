"""Telemetry partitions: monthly ranges created ahead, dropped whole past retention.

The tables whose rows grow with time are range-partitioned by their time column (epoch
seconds, UTC): state segments by ``start``, closed minute metrics by ``hour``, health events
by ``at``; one partition per UTC calendar month, named ``<table>_pYYYYMM``, and a default
partition ``<table>_default`` that takes any row outside the created months, so no row is
ever refused. ``maintain`` (the periodic job below; idempotent, bounded, logged):

1. creates the partitions of this month and ``AHEAD_MONTHS`` after it, and of any month the
   default partition holds rows of (moving those rows in; the count is logged);
2. drops at most ``MAX_DROPS`` partitions per table whose whole month ended more than
   ``telemetry_retention_days`` ago. A segment still running past its partition's end (a GPU
   healthy for longer than the retention) is first carried into the next month, clipped to
   start there: the part before is what retention drops;
3. deletes default-partition rows older than the retention, and logs how many rows the default
   partition still holds (a warning when any: they are stored, but outside the created months).

Partition DDL waits at most ``LOCK_TIMEOUT`` for ingest's locks; a job that times out fails
and the next run does the work.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import procrastinate
from procrastinate import job_context
from sqlalchemy import Connection, text
from sqlalchemy.orm import Session

from app.core.db import transaction
from app.core.epoch import epoch, from_epoch
from app.settings import Settings

log = logging.getLogger(__name__)

AHEAD_MONTHS = 2
MAX_DROPS = 3  # per table and run: a long-stopped job catches up over a few runs, in bounds
LOCK_TIMEOUT = "5s"
DAY = 86400


@dataclass(frozen=True)
class Partitioned:
    """A partitioned telemetry table: its partition key and each partition's storage options."""

    table: str
    key: str
    options: str  # WITH (...) of each partition: partitioned parents take none themselves


# Segments: room on each page so extending ``end`` is a HOT update. Closed metrics: slots are
# deflated by packing.stored and stay in the row (STORAGE MAIN, on the parent, copied by LIKE).
TABLES = (
    Partitioned("gpu_state_segments", "start", "fillfactor = 70"),
    Partitioned("gpu_minute_metrics", "hour", "toast_tuple_target = 128"),
    Partitioned("health_events", "at", "fillfactor = 100"),
)


@dataclass
class Report:
    created: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    moved_from_default: int = 0
    carried_segments: int = 0
    expired_from_default: int = 0
    left_in_default: dict[str, int] = field(default_factory=dict)


def month_of(second: int) -> int:
    """The start (epoch s) of the UTC calendar month holding ``second``."""
    moment = from_epoch(second)
    return epoch(datetime(moment.year, moment.month, 1, tzinfo=UTC))


def next_month(month: int) -> int:
    return month_of(month + 32 * DAY)


def partition_name(table: str, month: int) -> str:
    return f"{table}_p{from_epoch(month):%Y%m}"


def default_name(table: str) -> str:
    return f"{table}_default"


def months(first: int, last: int) -> list[int]:
    """The month starts from ``first``'s month through ``last``'s."""
    out, month = [], month_of(first)
    while month <= last:
        out.append(month)
        month = next_month(month)
    return out


def existing(connection: Connection, table: str) -> dict[int, str]:
    """The table's monthly partitions by month start (the default partition is not listed)."""
    names = connection.scalars(
        text("""
        SELECT c.relname FROM pg_inherits i
        JOIN pg_class c ON c.oid = i.inhrelid
        JOIN pg_class p ON p.oid = i.inhparent
        WHERE p.relname = :table AND c.relname LIKE :pattern
        """),
        {"table": table, "pattern": f"{table}\\_p%"},
    )
    out = {}
    for name in names:
        stamp = name.removeprefix(f"{table}_p")
        out[epoch(datetime(int(stamp[:4]), int(stamp[4:]), 1, tzinfo=UTC))] = name
    return out


def create_default(connection: Connection, spec: Partitioned) -> None:
    connection.execute(
        text(
            f"CREATE TABLE IF NOT EXISTS {default_name(spec.table)} PARTITION OF {spec.table} "
            f"DEFAULT WITH ({spec.options})"
        )
    )


def create_partition(connection: Connection, spec: Partitioned, month: int) -> int:
    """Create the month's partition, moving in the default partition's rows of that month
    (the range may not overlap rows the default holds); how many rows moved."""
    name, default = partition_name(spec.table, month), default_name(spec.table)
    lo, hi = month, next_month(month)
    _lock(connection, spec.table)
    connection.execute(
        text(
            f"CREATE TABLE {name} (LIKE {spec.table} INCLUDING DEFAULTS INCLUDING CONSTRAINTS "
            f"INCLUDING STORAGE INCLUDING COMPRESSION) WITH ({spec.options})"
        )
    )
    moved = connection.execute(
        text(f"""
        WITH moved AS (DELETE FROM {default} WHERE {spec.key} >= :lo AND {spec.key} < :hi
                       RETURNING *)
        INSERT INTO {name} SELECT * FROM moved
        """),
        {"lo": lo, "hi": hi},
    ).rowcount
    # Attaching builds the partition's share of every index and takes the foreign keys.
    connection.execute(
        text(f"ALTER TABLE {spec.table} ATTACH PARTITION {name} FOR VALUES FROM ({lo}) TO ({hi})")
    )
    return moved


def _lock(connection: Connection, table: str) -> None:
    """Hold off ingest (a few ms; at most LOCK_TIMEOUT waiting for it) while partitions
    change: a batch extending a segment that is being carried forward would be lost."""
    connection.execute(text(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE"))


def ensure_partitions(connection: Connection, wanted: Iterable[int], report: Report) -> None:
    """Create each table's partitions of the ``wanted`` months that do not exist yet."""
    for spec in TABLES:
        have = existing(connection, spec.table)
        for month in sorted(set(wanted) - set(have)):
            report.moved_from_default += create_partition(connection, spec, month)
            report.created.append(partition_name(spec.table, month))


def _months_in_default(connection: Connection, spec: Partitioned, cutoff: int) -> set[int]:
    seconds = connection.scalars(
        text(
            f"SELECT DISTINCT {spec.key} - {spec.key} % 86400 FROM {default_name(spec.table)} "
            f"WHERE {spec.key} >= :cutoff"
        ),
        {"cutoff": cutoff},
    )
    return {month_of(second) for second in seconds}


def _carry_segments(connection: Connection, source: str, boundary: int) -> int:
    """Copy the segments of ``source`` still running at ``boundary``, clipped to start there."""
    return connection.execute(
        text(f"""
        INSERT INTO gpu_state_segments (gpu_uuid, start, "end", state, evidence, received_at)
        SELECT gpu_uuid, :b, "end", state, evidence, received_at FROM {source}
        WHERE start < :b AND "end" > :b
        """),
        {"b": boundary},
    ).rowcount


def drop_expired(connection: Connection, cutoff: int, report: Report) -> None:
    """Drop partitions whose month ended by ``cutoff`` (at most MAX_DROPS per table), oldest
    first; expire default-partition rows before ``cutoff``."""
    for spec in TABLES:
        expired = sorted(m for m in existing(connection, spec.table) if next_month(m) <= cutoff)
        default = default_name(spec.table)
        stale = connection.scalar(
            text(f"SELECT EXISTS (SELECT 1 FROM {default} WHERE {spec.key} < :cutoff)"),
            {"cutoff": cutoff},
        )
        if not expired and not stale:
            continue
        _lock(connection, spec.table)
        for month in expired[:MAX_DROPS]:
            name = partition_name(spec.table, month)
            if spec.table == "gpu_state_segments":
                report.carried_segments += _carry_segments(connection, name, next_month(month))
            connection.execute(text(f"ALTER TABLE {spec.table} DETACH PARTITION {name}"))
            connection.execute(text(f"DROP TABLE {name}"))
            report.dropped.append(name)
        if spec.table == "gpu_state_segments":
            report.carried_segments += _carry_segments(connection, default, cutoff)
        report.expired_from_default += connection.execute(
            text(f"DELETE FROM {default} WHERE {spec.key} < :cutoff"), {"cutoff": cutoff}
        ).rowcount


def maintain(connection: Connection, now: int, retention_days: int) -> Report:
    """Create partitions ahead, drop expired ones, report the default partitions. Idempotent."""
    connection.execute(text(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'"))
    report = Report()
    cutoff = now - retention_days * DAY
    wanted = set(months(now, now))
    for _ in range(AHEAD_MONTHS):
        wanted.add(next_month(max(wanted)))
    for spec in TABLES:
        wanted |= _months_in_default(connection, spec, cutoff)
    ensure_partitions(connection, wanted, report)
    drop_expired(connection, cutoff, report)
    for spec in TABLES:
        report.left_in_default[spec.table] = connection.scalar(
            text(f"SELECT count(*) FROM {default_name(spec.table)}")
        )
    _log(report)
    return report


def _log(report: Report) -> None:
    fields = {
        "partitions_created": report.created,
        "partitions_dropped": report.dropped,
        "moved_from_default": report.moved_from_default,
        "carried_segments": report.carried_segments,
        "expired_from_default": report.expired_from_default,
        "left_in_default": report.left_in_default,
    }
    log.info("telemetry partitions maintained", extra=fields)
    if any(report.left_in_default.values()):
        log.warning("telemetry rows outside the created partitions", extra=fields)


tasks = procrastinate.Blueprint()


@tasks.periodic(cron="17 * * * *")
@tasks.task(name="partitions", queueing_lock="telemetry_partitions", pass_context=True)
def maintain_partitions(context: job_context.JobContext, timestamp: int) -> list[str]:
    """Hourly: create this month's and the next months' partitions, drop expired ones."""
    engine = context.additional_context["engine"]
    settings: Settings = context.additional_context["settings"]
    with transaction(engine) as session:
        report = maintain(_connection(session), timestamp, settings.telemetry_retention_days)
    return report.created + report.dropped


def _connection(session: Session) -> Connection:
    return session.connection()
