"""Packed minute rows and the repository functions billing calls."""

from __future__ import annotations

import itertools
import random
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, text

from app.core.db import transaction
from app.metering import idle, packing, reads, repository, summaries
from metering_agent.protocol import GpuState, UsageRecord
from tests.harness import Console
from tests.metering.conftest import Agent, minute_ago, rec


def record(start: int, end: int, **fields: Any) -> UsageRecord:
    return UsageRecord("GPU-1", "H100", start, end, GpuState.HEALTHY, end - start, **fields)


def _slot(observed: int, util_n: int, util_sum: int) -> bytes:
    """A packed minute with only its observed seconds and utilisation count and sum set."""
    return packing.SLOT.pack(observed, util_n, util_sum, 0, 0, 0, 0, 0, 0, 0)


def test_a_minute_combines_its_records_exactly() -> None:
    hour = 7200
    row = packing.add_records(
        packing.EMPTY_ROW,
        [
            record(
                hour + 60,
                hour + 80,
                gpu_util_mean=10.0,
                gpu_util_max=30,
                energy_j=100.0,
                power_max_w=50.5,
                temp_max_c=0,
                mem_used_max_mib=80_000,
            ),
            record(hour + 80, hour + 120, gpu_util_mean=40.0, gpu_util_max=70, energy_j=200.0),
            record(hour + 3540, hour + 3600),
        ],
    )
    assert len(row) == packing.ROW_BYTES == 60 * 19
    first, last = packing.minutes(hour, row)
    assert (first.start, first.observed_s, first.util_mean, first.util_max) == (
        hour + 60,
        60,
        30.0,
        70,
    )
    assert (first.energy_j, first.power_max_w, first.temp_max_c, first.mem_used_max_mib) == (
        300.0,
        50.5,
        0,
        80_000,
    )
    assert (last.start, last.util_mean, last.energy_j, last.temp_max_c) == (
        hour + 3540,
        None,
        None,
        None,
    )


def test_billing_reads_clip_and_report_late_data(agent: Agent, db: Engine) -> None:
    t = minute_ago(10)
    agent.post(
        [
            rec("GPU-1", t, t + 60, gpu_util_mean=25.0),
            rec("GPU-1", t + 60, t + 90, "failed", gpu_util_mean=0.0),
        ]
    )
    with transaction(db) as session:
        rows = reads.segments_between(session, ["GPU-1", "GPU-X"], t + 30, t + 80)
        assert [(r.start, r.end, r.state) for r in rows["GPU-1"]] == [
            (t + 30, t + 60, "healthy"),
            (t + 60, t + 80, "failed"),
        ]
        assert rows["GPU-X"] == []
        # 1 % threshold: the failed minute (0 %) is idle, the 25 % one is not.
        assert reads.idle_minutes(session, ["GPU-1"], t, t + 600, 10) == {"GPU-1": [t + 60]}
        assert reads.idle_minutes(session, ["GPU-1"], t, t + 600, 260) == {"GPU-1": [t, t + 60]}
        assert reads.idle_minutes(session, ["GPU-1"], t + 60, t + 600, 0) == {"GPU-1": []}
        finalized = datetime.now(UTC)
    agent.post([rec("GPU-1", t - 60, t)])  # late: extends the first segment backwards
    with transaction(db) as session:
        assert reads.late_segments_since(session, ["GPU-1"], t, t + 60, finalized)
        assert not reads.late_segments_since(session, ["GPU-1"], t + 60, t + 90, finalized)
        later = finalized + timedelta(hours=1)
        assert not reads.late_segments_since(session, ["GPU-1"], t - 60, t + 90, later)


@given(
    slots=st.lists(
        # A utilisation count never exceeds the seconds observed in the minute.
        st.tuples(st.integers(0, 60), st.integers(0, 60), st.integers(0, 6000)).map(
            lambda s: (max(s[0], s[1]), s[1], s[2])
        ),
        min_size=packing.SLOTS,
        max_size=packing.SLOTS,
    ),
    threshold_tenths=st.integers(0, 1000),
)
def test_idle_scan_agrees_with_the_full_decoder(
    slots: list[tuple[int, int, int]], threshold_tenths: int
) -> None:
    row = b"".join(_slot(observed, n, total) for observed, n, total in slots)
    decoded = [
        m.start
        for m in packing.minutes(7200, row)
        if m.util_n and 10 * m.util_sum < threshold_tenths * m.util_n
    ]
    assert idle.idle_minutes(7200, row, threshold_tenths) == decoded


def test_each_gpu_keeps_one_open_hour_and_late_minutes_reach_closed_hours(
    agent: Agent, db: Engine
) -> None:
    now = minute_ago(0)
    hour = packing.hour_of(now) - 3 * packing.HOUR
    agent.post([rec("GPU-1", hour + 60, hour + 120, mem_total_mib=80)])
    agent.post([rec("GPU-1", hour + packing.HOUR, hour + packing.HOUR + 60)])
    agent.post([rec("GPU-1", hour, hour + 60), rec("GPU-1", hour + 2 * packing.HOUR, hour + 7260)])
    with transaction(db) as session:
        open_rows = session.execute(
            text("SELECT gpu_uuid, hour FROM gpu_minute_metrics_open")
        ).all()
        closed = session.execute(
            text("SELECT hour, mem_total_mib FROM gpu_minute_metrics ORDER BY hour")
        ).all()
        minutes = reads.minute_rows(session, ["GPU-1"], hour, hour + 3 * packing.HOUR)
    assert open_rows == [("GPU-1", hour + 2 * packing.HOUR)]
    assert closed == [(hour, 80), (hour + packing.HOUR, None)]
    assert [m.start for m in minutes["GPU-1"]] == [
        hour,
        hour + 60,
        hour + packing.HOUR,
        hour + 2 * packing.HOUR,
    ]


def _row(util_n: int, util_sum: int) -> bytes:
    return _slot(60, util_n, util_sum) * packing.SLOTS


def test_idle_scan_on_whole_hours() -> None:
    hour = 3600 * 5
    every_minute = [hour + 60 * i for i in range(packing.SLOTS)]
    assert idle.idle_minutes(hour, _row(60, 60 * 50), 10) == []  # busy: the fast path
    assert idle.idle_minutes(hour, _row(60, 0), 10) == every_minute  # 0 %
    assert idle.idle_minutes(hour, _row(60, 59), 10) == every_minute  # 0.98 % < 1 %
    assert idle.idle_minutes(hour, _row(60, 60), 10) == []  # exactly 1 % is not idle
    assert idle.idle_minutes(hour, _row(30, 29), 10) == every_minute  # fewer samples
    assert idle.idle_minutes(hour, _row(0, 0), 10) == []  # nothing observed: not idle
    assert idle.idle_minutes(hour, _row(60, 300 * 60), 500) == []  # 300 % x 60 > bound


@given(
    slots=st.lists(
        st.tuples(st.integers(0, 60), st.integers(0, 6000)), min_size=packing.SLOTS, max_size=60
    ),
    threshold_tenths=st.integers(0, 1000),
)
def test_the_stored_summary_says_exactly_which_hours_hold_an_idle_minute(
    slots: list[tuple[int, int]], threshold_tenths: int
) -> None:
    row = b"".join(_slot(60, n, total) for n, total in slots)
    floor = idle.util_floor_tenths(row)
    has_idle = bool(idle.idle_minutes(0, row, threshold_tenths))
    assert has_idle == (floor is not None and floor < threshold_tenths)


def test_closed_hours_carry_the_summary_and_busy_ones_are_not_read(db: Engine) -> None:
    with transaction(db) as session:
        session.execute(
            text(
                "INSERT INTO nodes (id, hostname, datacenter) VALUES (gen_random_uuid(), 'n', 'd')"
            )
        )
        session.execute(
            text(
                "INSERT INTO gpus (uuid, node_id, model, pool) SELECT 'GPU-1', id, 'H100', "
                "'rentable' FROM nodes"
            )
        )
        busy, idle_hour = _row(60, 60 * 40), _row(60, 30)  # 40 % and 0.5 %
        repository.write_metric_rows(
            session, {("GPU-1", 0): (busy, None), ("GPU-1", 3600): (idle_hour, None)}, closed=True
        )
        query = text("SELECT hour, util_min_tenths FROM gpu_minute_metrics")
        stored = {hour: tenths for hour, tenths in session.execute(query)}
        assert stored == {0: 400, 3600: 5}
        idle_at_1_percent = reads.idle_minutes(session, ["GPU-1"], 0, 7200, 10)
        assert idle_at_1_percent == {"GPU-1": [3600 + 60 * i for i in range(60)]}
        assert reads.idle_minutes(session, ["GPU-1"], 0, 7200, 5) == {"GPU-1": []}


_readings = st.fixed_dictionaries(
    {
        "gpu_util_mean": st.none() | st.floats(0, 100),
        "gpu_util_max": st.none() | st.integers(0, 100),
        "mem_util_mean": st.none() | st.floats(0, 100),
        "mem_used_max_mib": st.none() | st.integers(0, 2**33),
        "energy_j": st.none() | st.floats(0, 1e6),
        "power_max_w": st.none() | st.floats(0, 2000),
        "temp_max_c": st.none() | st.integers(0, 300),
    }
)


@given(
    before=st.lists(st.tuples(st.integers(0, 3599), st.integers(1, 60), _readings), max_size=40),
    upload=st.lists(st.tuples(st.integers(0, 3599), st.integers(1, 60), _readings), min_size=1),
)
def test_combining_into_the_touched_span_equals_repacking_the_whole_row(
    before: list[tuple[int, int, dict[str, Any]]], upload: list[tuple[int, int, dict[str, Any]]]
) -> None:
    """What ingest does to an open row (read the span of slots an upload touches, combine,
    write the span back in place) leaves the row that combining into the whole row would."""

    def records(items: list[tuple[int, int, dict[str, Any]]]) -> list[UsageRecord]:
        return [record(7200 + at, 7200 + at + n, **readings) for at, n, readings in items]

    row = packing.add_records(packing.EMPTY_ROW, records(before))
    added = records(upload)
    first, count = packing.span_bounds(added)
    lo, hi = first * packing.SLOT.size, (first + count) * packing.SLOT.size
    span = packing.add_records(row[lo:hi], added, first)
    assert row[:lo] + span + row[hi:] == packing.add_records(row, added)


def test_uploads_every_few_seconds_store_what_one_upload_of_all_would(
    agent: Agent, db: Engine
) -> None:
    """Agent-shaped uploads (each round's records cut at every minute, several GPUs, rounds of
    1-5 s, across an hour boundary, some rounds holding records of both hours, re-sends among
    them) leave the closed and the open hour exactly as packing all their records at once
    does; the closed hour, copied at the turn raw and unsummarised, then summarised."""
    rng = random.Random(31)
    hour = packing.hour_of(minute_ago(0)) - 2 * packing.HOUR
    gpus = [f"GPU-{g}" for g in range(3)]
    sent: dict[str, list[UsageRecord]] = {gpu: [] for gpu in gpus}
    t, end = hour + packing.HOUR - 150, hour + packing.HOUR + 130
    crossing = 0
    while t < end:
        cut = min(t + rng.randint(1, 5), end)
        cuts = [t, *range(t - t % 60 + 60, cut, 60), cut]
        crossing += t < hour + packing.HOUR < cut
        batch = []
        for gpu in gpus:
            for a, b in itertools.pairwise(cuts):
                fields: dict[str, Any] = {
                    "gpu_util_mean": rng.uniform(0, 100),
                    "energy_j": rng.uniform(0, 1400),
                    "mem_total_mib": 81559,
                    "temp_max_c": rng.randint(30, 90),
                }
                batch.append(rec(gpu, a, b, **fields))
                sent[gpu].append(record_of(batch[-1]))
        agent.post(batch)
        if rng.random() < 0.1:
            agent.post(batch)  # a re-send: duplicates, nothing combined twice
        t = cut
    assert crossing == 1  # the seed's rounds: one holds records of both hours
    expected = {}
    for gpu, records in sent.items():
        for h in (hour, hour + packing.HOUR):
            of_hour = [r for r in records if packing.hour_of(r.start) == h]
            expected[(gpu, h)] = (packing.add_records(packing.EMPTY_ROW, of_hour), 81559)
    floors = {key: idle.util_floor_tenths(row) for key, (row, _) in expected.items()}
    rows = _metric_rows(db)
    assert {key: (row, mem) for key, (row, mem, _) in rows.items()} == expected
    closed = [(gpu, hour) for gpu in gpus]
    assert {key: rows[key][0] for key in closed} == {key: expected[key][0] for key in closed}
    assert {rows[key][2] for key in closed} == {idle.UNSUMMARISED}
    idle_below_half = {gpu: idle.idle_minutes(hour, expected[(gpu, hour)][0], 500) for gpu in gpus}
    assert all(idle_below_half.values())
    with transaction(db) as session:  # unsummarised hours are scanned, not skipped
        assert reads.idle_minutes(session, gpus, hour, hour + 3600, 500) == idle_below_half
        assert summaries.summarise(session) == len(gpus)
        assert summaries.summarise(session) == 0
    rows = _metric_rows(db)
    assert {key: (row, mem) for key, (row, mem, _) in rows.items()} == expected
    assert {key: rows[key][2] for key in closed} == {key: floors[key] for key in closed}


_HALF_MINUTES = 3 * packing.SLOTS * 2  # three hours of 30-s pieces


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    pieces=st.lists(
        st.tuples(st.sampled_from([0, 1]), st.integers(0, _HALF_MINUTES - 1)),
        min_size=1,
        max_size=40,
        unique=True,
    ),
    cuts=st.lists(st.integers(1, 6), min_size=40, max_size=40),
    data=st.data(),
)
def test_batches_in_any_order_across_hours_store_what_packing_them_at_once_would(
    client: TestClient,
    console: Console,
    db: Engine,
    pieces: list[tuple[int, int]],
    cuts: list[int],
    data: st.DataObject,
) -> None:
    """Records of three hours arriving in any order and grouping (late ones, replays of an
    older hour, rounds straddling a turn) leave each GPU's rows, closed and open, as packing
    them all at once does, whichever path (span, roll, whole row) each batch took."""
    node = uuid.uuid4().hex[:12]  # a new node and GPUs each example: no state shared
    registered = console.node(node)
    agent = Agent(client, registered["node"]["id"], registered["token"]["key"])
    gpus = [f"GPU-{node}-{g}" for g in range(2)]
    # In time order, as agents send (rounds straddle the turns), or in any order (replays).
    in_order, shuffled = data.draw(st.booleans()), data.draw(st.permutations(pieces))
    first_hour = packing.hour_of(minute_ago(0)) - 4 * packing.HOUR
    records = [
        rec(gpus[g], first_hour + 30 * i, first_hour + 30 * i + 30, gpu_util_mean=float(i % 97))
        for g, i in (sorted(pieces, key=lambda p: (p[1], p[0])) if in_order else shuffled)
    ]
    at = 0
    for n in cuts:
        if at < len(records):
            agent.post(records[at : at + n])
            at += n
    expected: dict[tuple[str, int], list[UsageRecord]] = {}
    for item in records:
        key = (item["gpu_uuid"], packing.hour_of(item["start"]))
        expected.setdefault(key, []).append(record_of(item))
    rows = _metric_rows(db)
    stored = {key: row for key, (row, _, _) in rows.items() if key[0] in gpus}
    assert stored == {
        key: packing.add_records(packing.EMPTY_ROW, rs) for key, rs in expected.items()
    }
    # Each GPU keeps one open row, its newest hour; no closed hour is newer.
    for gpu in gpus:
        hours = sorted(h for g, h in stored if g == gpu)
        open_hours = [h for (g, h), (_, _, floor) in rows.items() if g == gpu and floor is None]
        assert open_hours == hours[-1:] or not hours


def _metric_rows(db: Engine) -> dict[tuple[str, int], tuple[bytes, int, int | None]]:
    """(GPU, hour) -> the row's slots (inflated), memory total and idle floor (None: open)."""
    with transaction(db) as session:
        rows = session.execute(
            text(
                "SELECT gpu_uuid, hour, slots, mem_total_mib, util_min_tenths"
                " FROM gpu_minute_metrics UNION ALL SELECT gpu_uuid, hour, slots, mem_total_mib,"
                " NULL FROM gpu_minute_metrics_open"
            )
        ).all()
    return {(g, h): (packing.loaded(bytes(s)), m, f) for g, h, s, m, f in rows}


def record_of(item: dict[str, Any]) -> UsageRecord:
    return UsageRecord(
        item["gpu_uuid"],
        item["model"],
        item["start"],
        item["end"],
        GpuState(item["state"]),
        item["sample_count"],
        **{k: v for k, v in item.items() if k not in _RECORD_KEYS},
    )


_RECORD_KEYS = frozenset({"gpu_uuid", "model", "start", "end", "state", "sample_count"})
