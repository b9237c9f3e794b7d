"""Record boundaries: state change, minute boundary, gaps, floors and clock jumps."""

from __future__ import annotations

import threading
from pathlib import Path

from metering_agent.metrics import Metrics
from metering_agent.nvml.provider import GpuReading
from metering_agent.nvml.simulated import SimulatedProvider
from metering_agent.protocol import GpuState, UsageRecord, record_errors
from metering_agent.records import RecordBuilder
from metering_agent.runner import Runner
from metering_agent.spool import Spool, read_batch
from tests.metering_agent.agent_helpers import T0, FakeClock, assert_no_overlap

H, D, F = GpuState.HEALTHY, GpuState.DEGRADED, GpuState.FAILED


def reading(util: int = 50, energy_mj: int | None = None) -> GpuReading:
    return GpuReading(0, "GPU-a", "H100", gpu_util=util, power_mw=300_000, energy_mj=energy_mj)


def feed(builder: RecordBuilder, seconds: list[int], states: list[GpuState]) -> list[UsageRecord]:
    out: list[UsageRecord] = []
    for s, state in zip(seconds, states, strict=True):
        out.extend(builder.add(s, reading(), state))
    return out + builder.close()


def spans(records: list[UsageRecord]) -> list[tuple[int, int, str]]:
    return [(r.start, r.end, r.state.value) for r in records]


def test_same_state_seconds_make_one_record_with_aggregates() -> None:
    b = RecordBuilder("GPU-a", "H100")
    out: list[UsageRecord] = []
    for i, util in enumerate([10, 50, 90]):
        out += b.add(T0 + i, reading(util, energy_mj=1_000_000 + 250_000 * i), H)
    [rec] = out + b.close()
    assert (rec.start, rec.end, rec.sample_count) == (T0, T0 + 3, 3)
    assert (rec.gpu_util_mean, rec.gpu_util_max, rec.power_max_w) == (50, 90, 300.0)
    # first second has no previous counter value: power x 1 s; then the counter's increase
    assert rec.energy_j == 300 + 250 + 250
    assert record_errors(rec, 0, now=T0 + 10) == []


def test_state_change_closes_the_record() -> None:
    recs = feed(RecordBuilder("GPU-a", "H100"), [T0, T0 + 1, T0 + 2, T0 + 3], [H, H, F, F])
    assert spans(recs) == [(T0, T0 + 2, "healthy"), (T0 + 2, T0 + 4, "failed")]


def test_records_never_cross_a_minute_boundary() -> None:
    seconds = list(range(T0, T0 + 90))  # 40 s into a minute, through the next one
    recs = feed(RecordBuilder("GPU-a", "H100"), seconds, [H] * 90)
    assert spans(recs) == [
        (T0, T0 + 20, "healthy"),
        (T0 + 20, T0 + 80, "healthy"),
        (T0 + 80, T0 + 90, "healthy"),
    ]
    assert all(record_errors(r, i, now=T0 + 100) == [] for i, r in enumerate(recs))


def test_a_missing_second_splits_the_record() -> None:
    recs = feed(RecordBuilder("GPU-a", "H100"), [T0, T0 + 1, T0 + 5], [H, H, H])
    assert spans(recs) == [(T0, T0 + 2, "healthy"), (T0 + 5, T0 + 6, "healthy")]


def test_seconds_before_the_floor_or_already_counted_are_refused() -> None:
    b = RecordBuilder("GPU-a", "H100", floor=T0 + 2)
    recs = feed(b, [T0, T0 + 1, T0 + 2, T0 + 3, T0 + 3, T0 + 1], [H] * 6)
    assert spans(recs) == [(T0 + 2, T0 + 4, "healthy")]


def make_runner(tmp_path: Path, clock: FakeClock, gpus: int = 2) -> tuple[Runner, Spool]:
    metrics = Metrics()
    spool = Spool(tmp_path / "spool", metrics=metrics, clock=clock.mono)
    provider = SimulatedProvider(gpus, seed=1, clock=clock.mono)
    return Runner(provider, spool, clock=clock, metrics=metrics), spool


def spooled_records(spool: Spool) -> list[dict]:
    spool.seal(force=True)
    return [r for p in spool.batches() for r in read_batch(p)["records"]]


def test_runner_covers_every_second_once(tmp_path: Path) -> None:
    clock = FakeClock()
    runner, spool = make_runner(tmp_path, clock)
    runner.run(threading.Event(), duration_s=150)
    runner.close()
    covered = assert_no_overlap(spooled_records(spool))
    for intervals in covered.values():
        seconds = [s for a, b in intervals for s in range(a, b)]
        assert seconds == list(range(T0 + 1, T0 + 151))  # one sample per second of the run


def test_forward_clock_jump_skips_seconds_without_overlap(tmp_path: Path) -> None:
    clock = FakeClock()
    clock.jumps = {10: 30.0}  # NTP step forward by 30 s after the 10th sleep
    runner, spool = make_runner(tmp_path, clock)
    runner.run(threading.Event(), duration_s=40)
    runner.close()
    records = spooled_records(spool)
    covered = assert_no_overlap(records)
    for intervals in covered.values():
        seconds = {s for a, b in intervals for s in range(a, b)}
        assert T0 + 9 in seconds and T0 + 10 not in seconds  # the tick that saw the jump
        assert T0 + 40 not in seconds and T0 + 41 in seconds  # is skipped, then sampling resumes
    assert runner.metrics.get("gpumeter_agent_clock_jumps_total") == 1
    gaps = [e for p in spool.batches() for e in read_batch(p)["events"] if e["kind"] == "unmetered"]
    assert {e["gpu_uuid"] for e in gaps} == set(covered), "one per GPU"
    assert {(e["rule"], e["detail"]["start"], e["detail"]["end"]) for e in gaps} == {
        ("clock_jump", T0 + 10, T0 + 41)
    }, "the skipped seconds, explained"


def test_backward_clock_jump_never_goes_back(tmp_path: Path) -> None:
    clock = FakeClock()
    clock.jumps = {20: -15.0}  # wall clock steps back 15 s
    runner, spool = make_runner(tmp_path, clock)
    runner.run(threading.Event(), duration_s=40)
    runner.close()
    records = spooled_records(spool)
    assert_no_overlap(records)
    for gpu in {r["gpu_uuid"] for r in records}:
        ends = [r["end"] for r in records if r["gpu_uuid"] == gpu]
        starts = [r["start"] for r in records if r["gpu_uuid"] == gpu]
        assert starts == sorted(starts) and ends == sorted(ends)
    events = [e for p in spool.batches() for e in read_batch(p)["events"]]
    assert {e["kind"] for e in events} == {"clock_jump"}


def test_restart_resumes_after_the_last_spooled_record(tmp_path: Path) -> None:
    clock = FakeClock()
    runner, spool = make_runner(tmp_path, clock)
    runner.run(threading.Event(), duration_s=10)
    runner.close()
    spool.close()
    clock.jumps = {1: -8.0}  # the restarted agent's clock is behind the spooled records
    runner2, spool2 = make_runner(tmp_path, clock)
    runner2.run(threading.Event(), duration_s=20)
    runner2.close()
    assert_no_overlap(spooled_records(spool2))
