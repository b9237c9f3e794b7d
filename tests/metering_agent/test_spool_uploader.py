"""Spool durability and size limit; uploader retries, timeouts and dead letters."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

import pytest

from metering_agent.metrics import Metrics
from metering_agent.nvml.simulated import SimulatedProvider
from metering_agent.protocol import GpuState, UsageRecord
from metering_agent.runner import Runner
from metering_agent.spool import Spool
from metering_agent.uploader import Backoff, Uploader
from tests.metering_agent.agent_helpers import T0, FakeClock, Sink, assert_no_overlap

FAST = Backoff(base_s=0.01, cap_s=0.05)


def record(i: int, gpu: str = "GPU-a") -> UsageRecord:
    return UsageRecord(gpu, "H100", T0 + i, T0 + i + 1, GpuState.HEALTHY, 1, gpu_util_mean=50.0)


def spooled_run(tmp_path: Path, seconds: int = 200, **spool_args: object) -> tuple[Spool, Metrics]:
    """Simulate ``seconds`` of 4 GPUs through the real runner into a spool (fake clock)."""
    clock, metrics = FakeClock(), Metrics()
    spool = Spool(tmp_path / "spool", metrics=metrics, clock=clock.mono, **spool_args)  # type: ignore[arg-type]
    runner = Runner(
        SimulatedProvider(4, seed=3, clock=clock.mono), spool, clock=clock, metrics=metrics
    )
    runner.run(threading.Event(), duration_s=seconds)
    runner.close()
    spool.seal(force=True)
    return spool, metrics


def test_flush_is_durable_and_a_torn_line_is_dropped(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    spool.append([record(0), record(1)], [])
    spool.flush()
    spool.close()
    with open(tmp_path / "journal.jsonl", "a") as f:
        f.write('{"record": {"gpu_uuid": "GPU-a", "st')  # killed mid-write
    reopened = Spool(tmp_path)
    [batch] = reopened.batches()
    assert [r["start"] for r in json.loads(batch.read_bytes())["records"]] == [T0, T0 + 1]
    assert reopened.last_ends == {"GPU-a": T0 + 2}
    reopened.remove(batch)
    assert Spool(tmp_path).last_ends == {"GPU-a": T0 + 2}, "state.json remembers uploaded ends"


def test_seal_splits_by_batch_size_and_keeps_ids(tmp_path: Path) -> None:
    spool = Spool(tmp_path, batch_max_items=3)
    spool.append([record(i) for i in range(7)], [])
    spool.flush()
    spool.seal()
    batches = spool.batches()
    assert len(batches) == 3
    ids = [json.loads(p.read_bytes())["batch_id"] for p in batches]
    assert [json.loads(p.read_bytes())["batch_id"] for p in Spool(tmp_path).batches()] == ids


def test_size_limit_holds_new_items_and_drops_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    metrics = Metrics()
    spool = Spool(tmp_path, max_bytes=1500, metrics=metrics)
    spool.append([record(i) for i in range(3)], [])
    spool.flush()
    spool.seal(force=True)
    before = {p: p.read_bytes() for p in spool.batches()}
    with caplog.at_level(logging.ERROR, logger="metering_agent"):
        spool.append([record(i) for i in range(3, 10)], [])
        spool.flush()
    assert spool.full and spool.held() > 0
    assert metrics.get("gpumeter_agent_spool_full") == 1
    assert metrics.get("gpumeter_agent_spool_held_items") == spool.held()
    assert any(r.getMessage() == "spool_full" and r.levelname == "ERROR" for r in caplog.records)
    assert spool.bytes() <= 1500
    assert all(p.read_bytes() == data for p, data in before.items()), "spooled data untouched"
    # uploads make room: the held items are written, none lost
    uploaded: list[int] = []
    while spool.batches():
        for p in spool.batches():
            uploaded += [r["start"] for r in json.loads(p.read_bytes())["records"]]
            spool.remove(p)
        spool.flush()
        spool.seal(force=True)
    assert not spool.full and metrics.get("gpumeter_agent_spool_full") == 0
    assert sorted(uploaded) == [T0 + i for i in range(10)]


def test_uploader_survives_500s_and_timeouts(tmp_path: Path, sink: Sink) -> None:
    spool, metrics = spooled_run(tmp_path, batch_max_items=40)
    expected = {
        (r["gpu_uuid"], r["start"])
        for p in spool.batches()
        for r in json.loads(p.read_bytes())["records"]
    }
    sink.script = [500, 503, ("sleep", 0.6), 500, ("sleep", 0.6)]
    uploader = Uploader(spool, sink.url, "tok", timeout_s=0.3, backoff=FAST, metrics=metrics)
    assert uploader.upload_pending(threading.Event())
    assert spool.batches() == []
    received = sink.all_records()
    assert len(received) > len(expected), "timed-out batches were stored and sent again"
    assert set(sink.records()) == expected, "after dedupe, every record exactly once"
    covered = assert_no_overlap(received)
    for intervals in covered.values():
        seconds = [s for a, b in intervals for s in range(a, b)]
        assert seconds == list(range(T0 + 1, T0 + 201)), "the run is covered, no gaps"
    assert metrics.get("gpumeter_agent_upload_errors_total") == 5
    assert sink.tokens == {"Bearer tok"}


def test_rejected_batch_goes_to_dead_letter_and_upload_carries_on(
    tmp_path: Path, sink: Sink
) -> None:
    spool = Spool(tmp_path, batch_max_items=2)
    spool.append([record(i) for i in range(6)], [])
    spool.flush()
    spool.seal()
    first = spool.batches()[0]
    sink.script = [422]
    metrics = Metrics()
    uploader = Uploader(spool, sink.url, "tok", backoff=FAST, metrics=metrics)
    assert uploader.upload_pending(threading.Event())
    assert [p.name for p in spool.dead_dir.iterdir()] == [first.name]
    assert sorted(sink.records()) == [("GPU-a", T0 + i) for i in range(2, 6)]
    assert metrics.get("gpumeter_agent_batches_dead_lettered_total") == 1


def test_429_is_retried_not_dead_lettered(tmp_path: Path, sink: Sink) -> None:
    spool = Spool(tmp_path)
    spool.append([record(0)], [])
    spool.flush()
    spool.seal(force=True)
    sink.script = [429]
    assert Uploader(spool, sink.url, "tok", backoff=FAST).upload_pending(threading.Event())
    assert list(spool.dead_dir.iterdir()) == [] and len(sink.records()) == 1


def test_upload_deadline_leaves_batches_spooled(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    spool.append([record(0)], [])
    spool.flush()
    spool.seal(force=True)
    uploader = Uploader(spool, "http://127.0.0.1:9", "tok", timeout_s=0.2, backoff=FAST)
    assert not uploader.upload_pending(threading.Event(), deadline=uploader._clock() + 0.3)
    assert len(spool.batches()) == 1
