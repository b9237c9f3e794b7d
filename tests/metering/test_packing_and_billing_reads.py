"""Packed minute rows and the repository functions billing calls."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine

from app.core.db import transaction
from app.metering import packing, repository
from metering_agent.protocol import GpuState, UsageRecord
from tests.metering.conftest import Agent, minute_ago, rec


def record(start: int, end: int, **fields: object) -> UsageRecord:
    return UsageRecord("GPU-1", "H100", start, end, GpuState.HEALTHY, end - start, **fields)


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
        rows = repository.segments_between(session, ["GPU-1", "GPU-X"], t + 30, t + 80)
        assert [(r.start, r.end, r.state) for r in rows["GPU-1"]] == [
            (t + 30, t + 60, "healthy"),
            (t + 60, t + 80, "failed"),
        ]
        assert rows["GPU-X"] == []
        util = repository.minute_utilisation(session, ["GPU-1"], t, t + 600)
        assert util == {"GPU-1": [(t, 25.0), (t + 60, 0.0)]}
        finalized = datetime.now(UTC)
    agent.post([rec("GPU-1", t - 60, t)])  # late: extends the first segment backwards
    with transaction(db) as session:
        assert repository.late_segments_since(session, ["GPU-1"], t, t + 60, finalized)
        assert not repository.late_segments_since(session, ["GPU-1"], t + 60, t + 90, finalized)
        later = finalized + timedelta(hours=1)
        assert not repository.late_segments_since(session, ["GPU-1"], t - 60, t + 90, later)
