"""Spool durability and size limit; uploader retries, timeouts and dead letters."""

from __future__ import annotations

import json
import logging
import random
import threading
from dataclasses import asdict
from email.utils import formatdate
from pathlib import Path
from typing import Any

import pytest

from metering_agent.metrics import Metrics
from metering_agent.nvml.simulated import SimulatedProvider
from metering_agent.protocol import GpuState, UsageRecord
from metering_agent.runner import Runner
from metering_agent.spool import Spool, coalesce, read_batch
from metering_agent.uploader import Backoff, Uploader, retry_after_seconds
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
    assert [r["start"] for r in read_batch(batch)["records"]] == [T0, T0 + 1]
    assert reopened.last_ends == {"GPU-a": T0 + 2}
    reopened.remove(batch)
    assert Spool(tmp_path).last_ends == {"GPU-a": T0 + 2}, "state.json remembers uploaded ends"


def test_seal_splits_by_batch_size_and_keeps_ids(tmp_path: Path) -> None:
    spool = Spool(tmp_path, batch_max_items=3)
    spool.append([record(i) for i in range(7)], [])
    spool.flush()
    assert len(spool.batches()) == 2, "full segments are sealed at once"
    spool.seal(force=True)
    batches = spool.batches()
    assert [len(read_batch(p)["records"]) for p in batches] == [3, 3, 1]
    ids = [read_batch(p)["batch_id"] for p in batches]
    assert [read_batch(p)["batch_id"] for p in Spool(tmp_path).batches()] == ids


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
            uploaded += [r["start"] for r in read_batch(p)["records"]]
            spool.remove(p)
        spool.flush()
        spool.seal(force=True)
    assert not spool.full and metrics.get("gpumeter_agent_spool_full") == 0
    assert sorted(uploaded) == [T0 + i for i in range(10)]


def test_uploader_survives_500s_and_timeouts(tmp_path: Path, sink: Sink) -> None:
    spool, metrics = spooled_run(tmp_path, batch_max_items=40)
    expected = {  # what the uploader sends of each batch: its seconds as runs
        (r["gpu_uuid"], r["start"])
        for p in spool.batches()
        for r in coalesce(read_batch(p)["records"])
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
    uploader.transport.close()  # its run() would: no socket left for the GC to warn about


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
    # The other two batches, each's two adjacent seconds sent as one record.
    assert sorted(sink.records()) == [("GPU-a", T0 + 2), ("GPU-a", T0 + 4)]
    assert metrics.get("gpumeter_agent_batches_dead_lettered_total") == 1
    uploader.transport.close()


def test_items_the_service_holds_are_not_resent_and_those_it_refuses_are_kept(
    tmp_path: Path, sink: Sink, caplog: pytest.LogCaptureFixture
) -> None:
    spool = Spool(tmp_path, batch_max_items=3)
    spool.append([record(0), record(0, "GPU-b"), record(0, "GPU-c"), record(1)], [])
    spool.flush()
    spool.seal(force=True)
    first = spool.batches()[0]
    held = {"outcome": "held", "reason": "GPU GPU-b is claimed by more than one node"}
    refused = {"outcome": "refused", "reason": "GPU GPU-c was retired by an operator"}
    sink.script = [
        (
            "answer",
            {
                "batch_id": "b",
                "accepted": 1,
                "duplicates": 0,
                "events_accepted": 0,
                "events_duplicate": 0,
                "not_stored": [
                    {"loc": ["records", 1], "gpu_uuid": "GPU-b", **held},
                    {"loc": ["records", 2], "gpu_uuid": "GPU-c", **refused},
                ],
            },
        )
    ]
    metrics = Metrics()
    uploader = Uploader(spool, sink.url, "tok", backoff=FAST, metrics=metrics)
    with caplog.at_level(logging.WARNING, logger="metering_agent"):
        assert uploader.upload_pending(threading.Event())
    assert spool.batches() == [] and sink.requests == 2  # each batch sent once: none re-sent
    [kept] = spool.dead_dir.iterdir()
    assert kept.name == f"{first.stem}.refused.json"
    [item] = json.loads(kept.read_text())["items"]
    assert (item["gpu_uuid"], item["reason"], item["item"]["gpu_uuid"]) == (
        "GPU-c",
        refused["reason"],
        "GPU-c",
    )
    assert metrics.get("gpumeter_agent_items_held_total") == 1
    assert metrics.get("gpumeter_agent_items_refused_total") == 1
    assert {r.getMessage().split()[0] for r in caplog.records} >= {"items_held", "items_refused"}
    uploader.transport.close()


def test_429_is_retried_not_dead_lettered(tmp_path: Path, sink: Sink) -> None:
    spool = Spool(tmp_path)
    spool.append([record(0)], [])
    spool.flush()
    spool.seal(force=True)
    sink.script = [429]
    uploader = Uploader(spool, sink.url, "tok", backoff=FAST)
    assert uploader.upload_pending(threading.Event())
    assert list(spool.dead_dir.iterdir()) == [] and len(sink.records()) == 1
    uploader.transport.close()


def test_upload_deadline_leaves_batches_spooled(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    spool.append([record(0)], [])
    spool.flush()
    spool.seal(force=True)
    uploader = Uploader(spool, "http://127.0.0.1:9", "tok", timeout_s=0.2, backoff=FAST)
    assert not uploader.upload_pending(threading.Event(), deadline=uploader._clock() + 0.3)
    assert len(spool.batches()) == 1


def test_retry_after_as_seconds_or_http_date() -> None:
    now = 1_700_000_000.0
    assert retry_after_seconds("7", now) == 7.0
    assert retry_after_seconds(formatdate(now + 30, usegmt=True), now) == 30.0
    assert retry_after_seconds(formatdate(now - 30, usegmt=True), now) == 0.0, "date passed"
    assert retry_after_seconds("-3", now) == 0.0
    for unusable in (None, "", "soon", "nan", "inf"):
        assert retry_after_seconds(unusable, now) is None


def test_backoff_waits_at_least_retry_after_with_jitter_and_a_cap() -> None:
    backoff = Backoff(base_s=1, cap_s=4, retry_after_max_s=60, rng=random.Random(7))
    delays = [backoff.next_delay(10.0) for _ in range(200)]
    assert all(10.0 <= d <= 15.0 for d in delays), "at least Retry-After, at most half again"
    assert max(delays) - min(delays) > 4, "spread, so a fleet does not return in lockstep"
    assert all(60.0 <= backoff.next_delay(86_400.0) <= 90.0 for _ in range(20)), "capped"
    backoff.attempts = 10_000  # a day-long outage: no overflow, still the cap
    assert all(2.0 <= backoff.next_delay() <= 4.0 for _ in range(20))


def test_beyond_the_memory_bound_each_gpus_loss_is_one_unmetered_event(tmp_path: Path) -> None:
    metrics = Metrics()
    spool = Spool(tmp_path, max_bytes=2_000, max_held_bytes=2_000, metrics=metrics)
    for i in range(40):  # 2 GPUs, 1 record each per second; about 5 fit on disk, 10 in memory
        spool.append([record(i, "GPU-a"), record(i, "GPU-b")], [])
        spool.flush()
    dropped = metrics.get("gpumeter_agent_spool_dropped_items_total")
    assert spool.full and dropped
    sent = drain(spool)
    events = {e["gpu_uuid"]: e for e in sent["events"]}
    assert set(events) == {"GPU-a", "GPU-b"}
    for gpu, event in events.items():
        kept = {r["start"] for r in sent["records"] if r["gpu_uuid"] == gpu}
        d = event["detail"]
        lost = set(range(d["start"], d["end"]))
        assert (event["kind"], event["rule"], d["reason"]) == (
            "unmetered",
            "spool_full",
            "spool_full",
        )
        assert d["seconds"] == d["records_lost"] == len(lost)
        assert not kept & lost and kept | lost == {T0 + i for i in range(40)}, "contiguous"
    assert sum(e["detail"]["records_lost"] for e in events.values()) == dropped
    assert not spool.full and metrics.get("gpumeter_agent_spool_full") == 0


def drain(spool: Spool) -> dict[str, list[dict[str, Any]]]:
    """Upload (here: read and remove) every batch until the spool holds nothing."""
    sent: dict[str, list[dict[str, Any]]] = {"records": [], "events": []}
    while spool.batches() or spool.held():
        for path in spool.batches():
            batch = read_batch(path)
            sent["records"] += batch["records"]
            sent["events"] += batch["events"]
            spool.remove(path)
        spool.flush()
        spool.seal(force=True)
    return sent


def test_a_damaged_batch_is_quarantined_its_readable_items_kept(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    spool.append([record(0), record(1)], [])
    spool.flush()
    spool.seal(force=True)
    spool.close()
    [batch] = spool.batches()
    damaged = batch.read_bytes() + b'{"record": {"gpu_uuid": "GPU-a"}}\n[]\n'
    batch.write_bytes(damaged)
    metrics = Metrics()
    reopened = Spool(tmp_path, metrics=metrics)
    assert metrics.get("gpumeter_agent_spool_quarantined_total") == 1
    [moved] = reopened.quarantine_dir.iterdir()
    assert moved.read_bytes() == damaged
    [kept] = reopened.batches()
    assert [r["start"] for r in read_batch(kept)["records"]] == [T0, T0 + 1]


def test_an_earlier_versions_batch_is_still_sent(tmp_path: Path) -> None:
    legacy = {
        "batch_id": "b-1",
        "records": [asdict(record(0))],
        "events": [],
        "protocol_version": 1,
    }
    (tmp_path / "batches").mkdir()
    (tmp_path / "batches" / "0000000007-b-1.json").write_text(json.dumps(legacy))
    spool = Spool(tmp_path)
    [batch] = spool.batches()
    assert batch.name.startswith("0000000008-") and batch.suffix == ".jsonl"
    assert read_batch(batch)["records"] == legacy["records"]
    assert spool.last_ends == {"GPU-a": T0 + 1}


def test_temp_files_left_by_a_crash_are_removed_at_start(tmp_path: Path) -> None:
    (tmp_path / "batches").mkdir()
    leftovers = [tmp_path / ".state.json.tmp", tmp_path / "batches" / ".0000000001-x.json.tmp"]
    for path in leftovers:
        path.write_bytes(b'{"batch_id": "x", "rec')  # killed while writing it
    spool = Spool(tmp_path)
    assert not any(path.exists() for path in leftovers)
    assert spool.batches() == [] and not list(spool.quarantine_dir.iterdir())
