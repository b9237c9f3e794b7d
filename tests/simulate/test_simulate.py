"""The fleet simulator writes what ingest would: contiguous segments, evidence from the agent's
classifier, one metrics row per GPU-hour (the newest one open), migrations to spares."""

from __future__ import annotations

import random
import time
from itertools import pairwise

import pytest
from sqlalchemy import Engine, text

from app.core.db import transaction
from app.metering import packing
from app.simulate.attribution import AUTO_WINDOW_S, Recovery
from app.simulate.fleet import create_fleet
from app.simulate.progress import Progress
from app.simulate.run import Options, Report, simulate

GPUS, DAYS, RATE = 48, 3, 0.2  # a high rate so a small fleet fails often


def run(db: Engine, recovery: Recovery) -> tuple[Options, Report]:
    end = int(time.time()) // 60 * 60
    options = Options(
        start=end - DAYS * 86_400 + 1234,  # not hour-aligned: cut first hour
        end=end,
        failure_rate=RATE,
        recovery=recovery,
        seed=3,
    )
    with transaction(db) as session:
        fleet = create_fleet(session, GPUS, options.start, end, random.Random(3), "t")
        report = simulate(session, fleet.gpus, options, Progress(quiet=True))
    return options, report


@pytest.fixture
def auto(db: Engine) -> tuple[Options, Report]:
    return run(db, Recovery.AUTO)


def rows(db: Engine, sql: str) -> list:
    with db.connect() as conn:
        return list(conn.execute(text(sql)))


def test_segments_cover_the_window_without_gaps(db: Engine, auto) -> None:
    options, report = auto
    segments = rows(db, 'SELECT gpu_uuid, start, "end" FROM gpu_state_segments ORDER BY 1, 2')
    assert len(segments) == report.segments
    by_gpu: dict[str, list[tuple[int, int]]] = {}
    for gpu, start, end in segments:
        by_gpu.setdefault(gpu, []).append((start, end))
    assert len(by_gpu) == GPUS
    for spans in by_gpu.values():
        assert spans[0][0] == options.start and spans[-1][1] == options.end
        assert all(a[1] == b[0] for a, b in pairwise(spans))


def test_failures_carry_classifier_evidence(db: Engine, auto) -> None:
    _, report = auto
    assert report.failures > 5
    failed = rows(db, "SELECT evidence FROM gpu_state_segments WHERE state = 'failed'")
    assert len(failed) == report.failures
    for (evidence,) in failed:
        assert evidence["rule"].startswith(("xid_", "gpu_lost")), evidence
        xids = [e.get("xid") for e in evidence["detail"]["evidence"]]
        assert any(x is not None for x in xids)
    xid_events = rows(db, "SELECT count(*) FROM health_events WHERE kind = 'xid'")
    assert xid_events[0][0] == report.failures


def test_one_metrics_row_per_gpu_hour_with_the_newest_hour_open(db: Engine, auto) -> None:
    options, report = auto
    hours = len(range(packing.hour_of(options.start), options.end, packing.HOUR))
    closed = rows(db, "SELECT count(*) FROM gpu_minute_metrics")[0][0]
    open_ = rows(db, "SELECT count(*) FROM gpu_minute_metrics_open")[0][0]
    assert open_ == GPUS and closed + open_ == GPUS * hours == report.metric_rows
    (slots,) = rows(db, "SELECT slots FROM gpu_minute_metrics ORDER BY hour LIMIT 1")[0]
    first = packing.minutes(0, bytes(slots))
    assert first and first[0].observed_s > 0


def test_hit_rentals_move_to_spares_within_seconds(db: Engine, auto) -> None:
    _, report = auto
    assert report.migrations > 0
    windows = rows(
        db, "SELECT extract(epoch FROM resumed_at - failed_at)::int FROM rental_migrations"
    )
    assert len(windows) == report.migrations
    assert all(AUTO_WINDOW_S[0] <= w <= AUTO_WINDOW_S[1] for (w,) in windows)


def test_manual_recovery_takes_about_47_minutes(db: Engine) -> None:
    _, report = run(db, Recovery.MANUAL)
    windows = rows(
        db, "SELECT extract(epoch FROM resumed_at - failed_at)::int FROM rental_migrations"
    )
    assert report.migrations == len(windows) > 0
    assert all(0.8 * 2820 <= w <= 1.2 * 2820 for (w,) in windows)
