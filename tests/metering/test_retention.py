"""Partition maintenance: months created ahead, expired ones dropped whole (a segment still
running carried forward), the default partition drained and reported; idempotent, bounded."""

from __future__ import annotations

import logging
import uuid
from datetime import UTC, datetime

import pytest
from sqlalchemy import Connection, Engine, text

from app.core import queue
from app.core.epoch import epoch
from app.metering import retention

NOW = epoch(datetime(2027, 3, 10, 12, 0, tzinfo=UTC))
DAY = 86400


def month(year: int, number: int) -> int:
    return epoch(datetime(year, number, 1, tzinfo=UTC))


def _gpu(connection: Connection, gpu: str) -> None:
    node = uuid.uuid4()
    connection.execute(
        text("INSERT INTO nodes (id, hostname, datacenter) VALUES (:n, :h, 'dc')"),
        {"n": node, "h": f"host-{node}"},
    )
    connection.execute(
        text("INSERT INTO gpus (uuid, node_id, model, pool) VALUES (:g, :n, 'H100', 'rentable')"),
        {"g": gpu, "n": node},
    )


def _segment(connection: Connection, gpu: str, start: int, end: int) -> None:
    connection.execute(
        text(
            'INSERT INTO gpu_state_segments (gpu_uuid, start, "end", state, evidence) '
            "VALUES (:g, :s, :e, 'healthy', '{\"rule\": \"r\"}')"
        ),
        {"g": gpu, "s": start, "e": end},
    )


def _event(connection: Connection, gpu: str, at: int) -> None:
    connection.execute(
        text(
            "INSERT INTO health_events (event_id, gpu_uuid, at, kind, detail) "
            "VALUES (:i, :g, :a, 'xid', '{}')"
        ),
        {"i": f"e-{at}", "g": gpu, "a": at},
    )


def _partitions(connection: Connection, table: str) -> list[str]:
    return sorted(retention.existing(connection, table).values())


def _segments(connection: Connection) -> list[tuple[object, ...]]:
    rows = connection.execute(
        text(
            "SELECT gpu_uuid, start, \"end\", evidence->>'rule', tableoid::regclass::text "
            "FROM gpu_state_segments ORDER BY 1, 2"
        )
    )
    return [tuple(r) for r in rows]


def test_creates_this_month_and_the_next_two_once(db: Engine) -> None:
    with db.begin() as connection:
        first = retention.maintain(connection, NOW, 400)
        second = retention.maintain(connection, NOW, 400)
        segments = _partitions(connection, "gpu_state_segments")
    assert {"gpu_state_segments_p202703", "gpu_state_segments_p202705"} <= set(first.created)
    assert "health_events_p202704" in first.created
    assert second.created == [] and second.dropped == []
    assert segments[-3:] == [f"gpu_state_segments_p20270{m}" for m in (3, 4, 5)]


def test_default_rows_move_into_their_new_month_and_old_ones_expire(
    db: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    kept_at, expired_at = NOW - 100 * DAY, NOW - 500 * DAY  # 2026-11-30, 2025-10-26
    with db.begin() as connection:
        _gpu(connection, "GPU-1")
        _event(connection, "GPU-1", kept_at)  # lands in the default partition (no 2026-11 yet)
        _event(connection, "GPU-1", expired_at)
        with caplog.at_level(logging.INFO, logger="app.metering.retention"):
            report = retention.maintain(connection, NOW, 400)
        homes = connection.execute(
            text("SELECT at, tableoid::regclass::text FROM health_events ORDER BY at")
        ).all()
    assert [tuple(h) for h in homes] == [(kept_at, "health_events_p202611")]
    assert report.moved_from_default == 1 and report.expired_from_default == 1
    assert report.left_in_default == dict.fromkeys(
        ("gpu_state_segments", "gpu_minute_metrics", "health_events"), 0
    )
    assert any(r.message == "telemetry partitions maintained" for r in caplog.records)


def test_expired_months_are_dropped_and_a_running_segment_carried_forward(db: Engine) -> None:
    cutoff = NOW - 400 * DAY  # 2026-02-03: January 2026 and older have expired
    with db.begin() as connection:
        retention.ensure_partitions(
            connection, retention.months(month(2025, 10), month(2026, 2)), retention.Report()
        )
        _gpu(connection, "GPU-1")
        _gpu(connection, "GPU-2")
        _segment(connection, "GPU-1", month(2025, 10) + 50, NOW - DAY)  # running still
        _segment(connection, "GPU-2", month(2025, 10) + 50, month(2025, 10) + 90)  # long over
        _event(connection, "GPU-2", month(2025, 12) + 5)
        report = retention.maintain(connection, NOW, 400)
        assert report.dropped[:3] == [f"gpu_state_segments_p2025{m}" for m in (10, 11, 12)]
        assert "health_events_p202512" in report.dropped
        # Bounded: three months a run; the fourth (2026-01) goes in the next run.
        assert "gpu_state_segments_p202601" in _partitions(connection, "gpu_state_segments")
        again = retention.maintain(connection, NOW, 400)
        assert again.dropped == [f"{t}_p202601" for t, _ in _keys()]
        assert retention.maintain(connection, NOW, 400).dropped == []
        segments = _segments(connection)
        events = connection.execute(text("SELECT count(*) FROM health_events")).scalar_one()
    assert next_month_start(cutoff) == month(2026, 3)
    assert segments == [("GPU-1", month(2026, 2), NOW - DAY, "r", "gpu_state_segments_p202602")]
    assert (report.carried_segments, again.carried_segments) == (3, 1)  # 11, 12, 01; then 02
    assert events == 0


def _keys() -> list[tuple[str, str]]:
    return [(spec.table, spec.key) for spec in retention.TABLES]


def next_month_start(second: int) -> int:
    return retention.next_month(retention.month_of(second))


def test_the_job_is_registered_to_run_hourly() -> None:
    task = queue.queue.tasks["metering:partitions"]
    assert task.queueing_lock == "telemetry_partitions"
    crons = [
        p.cron for p in queue.queue.periodic_registry.periodic_tasks.values() if p.task is task
    ]
    assert crons == ["17 * * * *"]
