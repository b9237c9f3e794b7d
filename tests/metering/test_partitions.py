"""Telemetry partitions (migration 0012): the conversion keeps every row, both ways; rows go to
their month's partition or, outside the created months, to the default one; every lookup
ingest and the readers make is served by an index on each partition."""

from __future__ import annotations

import random
import uuid
import zlib
from collections.abc import Iterator
from datetime import UTC, datetime

import psycopg
import pytest
from alembic import command
from sqlalchemy import Connection, Engine, TextClause, text
from sqlalchemy.orm import Session

from app.core import migrate
from app.core.epoch import epoch
from app.core.scratch_db import libpq_dsn, scratch_database
from app.metering import idle, packing, reads, repository
from metering_agent.protocol import GpuState, UsageRecord
from tests.metering.conftest import Agent, event, minute_ago, rec

SEPTEMBER = epoch(datetime(2026, 9, 30, 23, 0, tzinfo=UTC))
OCTOBER = epoch(datetime(2026, 10, 1, 0, 0, tzinfo=UTC))
TABLES = {
    "gpu_state_segments": 'SELECT gpu_uuid, start, "end", state, evidence::text, received_at '
    "FROM gpu_state_segments ORDER BY 1, 2",
    "gpu_minute_metrics": "SELECT gpu_uuid, hour, mem_total_mib, slots, util_min_tenths "
    "FROM gpu_minute_metrics ORDER BY 1, 2",
    "health_events": "SELECT event_id, gpu_uuid, at, kind, code, state, rule, detail::text, "
    "received_at FROM health_events ORDER BY 1, 2",
}


@pytest.fixture
def at_0010(pg_server_url: str) -> Iterator[str]:
    with scratch_database(pg_server_url, "gpumeter_test_0012", migrated=False) as url:
        migrate.upgrade(url, "0010")
        yield url


def _seed(conninfo: str) -> None:
    """Rows of 0010's shape in two months, for two GPUs."""
    node = uuid.uuid4()
    row = packing.add_records(packing.EMPTY_ROW, [])
    with psycopg.connect(conninfo) as conn:
        conn.execute("INSERT INTO nodes (id, hostname, datacenter) VALUES (%s, 'n', 'dc')", (node,))
        for gpu in ("GPU-a", "GPU-b"):
            conn.execute(
                "INSERT INTO gpus (uuid, node_id, model, pool) VALUES (%s, %s, 'H100', 'rentable')",
                (gpu, node),
            )
            conn.execute(
                'INSERT INTO gpu_state_segments (gpu_uuid, start, "end", state, evidence) '
                "VALUES (%s, %s, %s, 'healthy', NULL), (%s, %s, %s, 'failed', '{\"code\": 79}')",
                (gpu, SEPTEMBER, OCTOBER + 60, gpu, OCTOBER + 60, OCTOBER + 600),
            )
            conn.execute(
                "INSERT INTO gpu_minute_metrics (gpu_uuid, hour, mem_total_mib, slots, "
                "util_min_tenths) VALUES (%s, %s, 81559, %s, 7), (%s, %s, NULL, %s, NULL)",
                (gpu, SEPTEMBER, row, gpu, OCTOBER, row),
            )
            conn.execute(
                "INSERT INTO health_events (event_id, gpu_uuid, at, kind, code, detail) "
                "VALUES ('e1', %s, %s, 'xid', 79, '{}'), ('e2', %s, %s, 'xid', 48, '{}')",
                (gpu, SEPTEMBER + 5, gpu, OCTOBER + 60),
            )


def _rows(conninfo: str) -> dict[str, list[tuple[object, ...]]]:
    with psycopg.connect(conninfo) as conn:
        return {table: conn.execute(query).fetchall() for table, query in TABLES.items()}


def _homes(conninfo: str, table: str) -> list[str]:
    with psycopg.connect(conninfo) as conn:
        rows = conn.execute(f"SELECT DISTINCT tableoid::regclass::text FROM {table} ORDER BY 1")
        return [name for (name,) in rows]


def _relkind(conninfo: str, table: str) -> str:
    with psycopg.connect(conninfo) as conn:
        row = conn.execute("SELECT relkind::text FROM pg_class WHERE relname = %s", (table,))
        return str(row.fetchone()[0])  # type: ignore[index]


def test_upgrade_from_0010_keeps_every_row_in_its_month_and_downgrade_restores_them(
    at_0010: str,
) -> None:
    conninfo = libpq_dsn(at_0010)
    _seed(conninfo)
    before = _rows(conninfo)

    migrate.upgrade(at_0010, "0012")
    assert _rows(conninfo) == before
    for table in TABLES:
        assert _relkind(conninfo, table) == "p"
        assert _homes(conninfo, table) == [f"{table}_p202609", f"{table}_p202610"]

    command.downgrade(migrate.alembic_config(at_0010), "0010")
    assert _rows(conninfo) == before
    for table in TABLES:
        assert _relkind(conninfo, table) == "r"


def _one(connection: Connection, query: str, **params: object) -> object:
    return connection.execute(text(query), params).scalar_one()


def _add_gpu(connection: Connection, gpu: str) -> None:
    node = uuid.uuid4()
    connection.execute(
        text("INSERT INTO nodes (id, hostname, datacenter) VALUES (:n, :h, 'dc')"),
        {"n": node, "h": f"host-{node}"},
    )
    connection.execute(
        text("INSERT INTO gpus (uuid, node_id, model, pool) VALUES (:g, :n, 'H100', 'rentable')"),
        {"g": gpu, "n": node},
    )


def test_a_row_outside_the_created_months_is_stored_in_the_default_partition(db: Engine) -> None:
    long_ago = epoch(datetime(2001, 5, 3, tzinfo=UTC))
    with db.begin() as connection:
        _add_gpu(connection, "GPU-old")
        connection.execute(
            text(
                'INSERT INTO gpu_state_segments (gpu_uuid, start, "end", state) '
                "VALUES ('GPU-old', :s, :e, 'healthy')"
            ),
            {"s": long_ago, "e": long_ago + 60},
        )
    with db.begin() as connection:
        home = _one(connection, "SELECT tableoid::regclass::text FROM gpu_state_segments")
        spans = reads.segments_between(
            Session(bind=connection), ["GPU-old"], long_ago, long_ago + 60
        )
    assert home == "gpu_state_segments_default"
    assert [(s.start, s.end) for s in spans["GPU-old"]] == [(long_ago, long_ago + 60)]


def test_every_statement_on_a_partitioned_table_is_index_backed(db: Engine) -> None:
    """With sequential scans priced out, a statement without a usable index still shows
    one: none may. Covers ingest's reads and upserts' lookups and the readers' queries."""
    gpus, lo, hi = ["GPU-x", "GPU-y"], OCTOBER, OCTOBER + 7200
    statements: list[tuple[TextClause, dict[str, object]]] = [
        (repository._SEGMENTS_NEAR, {"gpus": gpus, "los": [lo, lo], "his": [hi, hi]}),
        (repository._UNSUMMARISED, {"pending": idle.UNSUMMARISED, "n": 100}),
        (
            text(
                "SELECT 1 FROM gpu_minute_metrics m JOIN unnest(CAST(:u AS text[]), "
                "CAST(:h AS bigint[])) AS k(gpu, hour) ON m.gpu_uuid = k.gpu AND m.hour = k.hour"
            ),
            {"u": gpus, "h": [lo, lo]},
        ),
        (
            text(
                "SELECT 1 FROM gpu_minute_metrics WHERE gpu_uuid = ANY(CAST(:u AS text[])) "
                "AND hour >= :lo AND hour < :hi"
            ),
            {"u": gpus, "lo": lo, "hi": hi},
        ),
        (
            text("SELECT 1 FROM health_events WHERE gpu_uuid = :u AND event_id = :e AND at = :a"),
            {"u": "GPU-x", "e": "e", "a": lo},
        ),
        (
            text("SELECT 1 FROM health_events WHERE gpu_uuid = :u AND event_id = :e"),
            {"u": "GPU-x", "e": "e"},
        ),
        (
            text("SELECT 1 FROM health_events WHERE gpu_uuid = :u AND at >= :lo AND at < :hi"),
            {"u": "GPU-x", "lo": lo, "hi": hi},
        ),
        (
            text("SELECT 1 FROM gpu_state_segments WHERE state = 'failed' AND start >= :s"),
            {"s": lo},
        ),
        (
            text(
                "SELECT 1 FROM gpu_state_segments WHERE gpu_uuid = ANY(CAST(:u AS text[])) "
                'AND start < :hi AND "end" > :lo'
            ),
            {"u": gpus, "lo": lo, "hi": hi},
        ),
    ]
    with db.begin() as connection:
        connection.execute(text("SET LOCAL enable_seqscan = off"))
        for statement, params in statements:
            plan = "\n".join(connection.scalars(text(f"EXPLAIN {statement.text}"), params))
            assert "Seq Scan" not in plan, f"{statement.text}\n{plan}"


def test_an_event_id_resent_with_another_time_is_a_conflict(agent: Agent, db: Engine) -> None:
    """The key includes ``at`` (the partition key): the content check still refuses it."""
    start = minute_ago(3)
    first = {**event("GPU-ev", start, code=79), "event_id": "e-1"}
    agent.post([rec("GPU-ev", start, start + 60)], [first])
    agent.post([], [first])  # the same again: a duplicate, accepted
    body = agent.post([], [{**first, "at": start + 1}], status=409)
    assert [item["loc"] for item in body["detail"]] == [["body", "events", 0, "event_id"]]
    with db.connect() as connection:
        stored = connection.execute(text("SELECT event_id, at FROM health_events")).all()
    assert [tuple(r) for r in stored] == [("e-1", start)]


def test_a_closed_hour_is_stored_deflated_and_read_back_exactly() -> None:
    rng = random.Random(5)
    records = [
        UsageRecord(
            "GPU-z",
            "H100",
            t,
            t + 60,
            GpuState.HEALTHY,
            60,
            gpu_util_mean=rng.uniform(0, 100),
            gpu_util_max=rng.randrange(101),
            mem_util_mean=rng.uniform(0, 60),
            mem_used_max_mib=rng.randrange(81559),
            energy_j=rng.uniform(4000, 42000),
            power_max_w=rng.uniform(70, 700),
            temp_max_c=rng.randrange(30, 80),
        )
        for t in range(0, packing.HOUR, 60)
    ]
    row = packing.add_records(packing.EMPTY_ROW, records)
    stored = packing.stored(row)
    assert len(stored) < packing.ROW_BYTES
    assert packing.loaded(stored) == row
    assert packing.loaded(row) == row  # raw rows (the open hour, older rows) read as they are
    # Rows deflated before the window shrank (32 KB, memLevel 9) read back, and are the very
    # bytes the smaller window writes: the stored format did not change.
    planes = b"".join(row[i :: packing.SLOT.size] for i in range(packing.SLOT.size))
    earlier = zlib.compressobj(9, zlib.DEFLATED, -15, 9)
    deflated_before = earlier.compress(planes) + earlier.flush()
    assert packing.loaded(deflated_before) == row
    assert deflated_before == stored
