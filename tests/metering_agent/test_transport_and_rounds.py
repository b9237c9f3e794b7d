"""Upload rounds (cuts, jitter, immediate sends) and the transport (keep-alive, gzip, reconnect)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from app.core.processes import wait_until
from metering_agent.faults import parse_faults
from metering_agent.metrics import Metrics
from metering_agent.nvml.simulated import SimulatedProvider
from metering_agent.protocol import GpuState, UsageRecord
from metering_agent.runner import Runner
from metering_agent.schedule import UploadSchedule
from metering_agent.spool import Spool, coalesce, read_batch
from metering_agent.uploader import Backoff, Uploader
from tests.metering_agent.agent_helpers import T0, FakeClock, Sink, assert_no_overlap

FAST = Backoff(base_s=0.01, cap_s=0.05)


def test_a_seeded_offset_is_reproducible_and_offsets_spread_over_the_interval() -> None:
    assert UploadSchedule.jittered(2.0, 7) == UploadSchedule.jittered(2.0, 7)
    offsets = [UploadSchedule.jittered(2.0, seed).offset_s for seed in range(1000)]
    assert all(0 <= o < 2.0 for o in offsets)
    per_quarter = [sum(1 for o in offsets if q / 2 <= o < (q + 1) / 2) for q in range(4)]
    assert min(per_quarter) > 200, per_quarter  # ~250 each: a fleet is spread, not bunched
    schedule = UploadSchedule(2.0, 0.75)
    assert schedule.first_round_from(T0) == T0 + 0.75  # T0 is even
    assert schedule.first_round_from(T0 + 0.75) == T0 + 0.75
    assert schedule.first_round_from(T0 + 0.76) == T0 + 2.75


def run_rounds(
    tmp_path: Path, seconds: int, schedule: UploadSchedule, faults: Any = None
) -> tuple[Spool, list[float]]:
    clock, metrics, sends = FakeClock(), Metrics(), list[float]()
    spool = Spool(tmp_path / "spool", metrics=metrics, clock=clock.mono, seal_after_s=3600)
    provider = SimulatedProvider(2, seed=1, clock=clock.mono, faults=faults)
    runner = Runner(
        provider, spool, clock=clock, metrics=metrics, schedule=schedule, send_at=sends.append
    )
    runner.run(threading.Event(), duration_s=seconds)
    return spool, sends


def test_every_round_cuts_and_seals_what_was_sampled_and_asks_to_send_at_its_time(
    tmp_path: Path,
) -> None:
    spool, sends = run_rounds(tmp_path, 12, UploadSchedule(2.0, 1.5))
    # Ticks sample seconds T0+1 .. T0+12; rounds at T0+1.5, +3.5, ... fall in the odd seconds.
    assert sends == [T0 + 1.5 + 2 * k for k in range(6)]
    batches = [read_batch(p)["records"] for p in spool.batches()]
    assert len(batches) == 6, "one sealed batch per round"
    for k, records in enumerate(batches):
        # Spooled a second at a time (a SIGKILL loses one at most), sent as runs that end at
        # the round's second.
        assert {r["end"] - r["start"] for r in records} == {1}
        assert {r["end"] for r in coalesce(records)} == {T0 + 2 + 2 * k}, "cut at the round"
    assert_no_overlap([r for records in batches for r in records])


def test_a_health_event_is_cut_sealed_and_sent_at_once(tmp_path: Path) -> None:
    faults = parse_faults([{"at": 4.6, "gpu": 0, "fault": "xid", "xid": 79}])
    spool, sends = run_rounds(tmp_path, 10, UploadSchedule(60.0, 30.0), faults)
    # No round in these 10 s (the next is at :30); the failure's tick is sent at once.
    [sent] = sends
    [batch] = [read_batch(p) for p in spool.batches()]
    failed = [r for r in batch["records"] if r["state"] == GpuState.FAILED]
    assert [(r["start"], r["end"]) for r in failed] == [(int(sent), int(sent) + 1)]
    assert {e["kind"] for e in batch["events"]} >= {"xid", "state_change"}


def records(n: int) -> list[UsageRecord]:
    return [
        UsageRecord("GPU-a", "H100", T0 + i, T0 + i + 1, GpuState.HEALTHY, 1, gpu_util_mean=50.0)
        for i in range(n)
    ]


def spool_batches(tmp_path: Path, n: int) -> Spool:
    spool = Spool(tmp_path)
    for record in records(n):
        spool.append([record], [])
        spool.flush()
        spool.seal(force=True)
    return spool


def test_batches_share_one_kept_alive_connection_gzip_encoded(tmp_path: Path, sink: Sink) -> None:
    spool, metrics = spool_batches(tmp_path, 5), Metrics()
    uploader = Uploader(spool, sink.url, "tok", backoff=FAST, metrics=metrics)
    assert uploader.upload_pending(threading.Event())
    assert len(sink.stored) == 5 and sink.encodings == ["gzip"] * 5
    assert sink.connections == 1, "one TCP connection for all five batches"
    assert metrics.get("gpumeter_agent_upload_connections_total") == 1
    sent = metrics.get("gpumeter_agent_upload_bytes_total")
    raw = metrics.get("gpumeter_agent_upload_uncompressed_bytes_total")
    assert sent and raw and sent < raw
    uploader.transport.close()  # its run() would: no socket left for the GC to warn about


def test_a_connection_the_service_dropped_is_reopened_and_the_batch_sent(
    tmp_path: Path, sink: Sink
) -> None:
    spool = spool_batches(tmp_path, 3)
    sink.script = ["drop_after", "drop_after"]  # closes each kept-alive connection, unannounced
    uploader = Uploader(spool, sink.url, "tok", backoff=FAST, metrics=Metrics())
    assert uploader.upload_pending(threading.Event())
    assert len(sink.stored) == 3 and sink.connections == 3
    assert sink.requests == 3, "no batch needed a second attempt beyond the reconnect"
    uploader.transport.close()


def test_without_gzip_bodies_go_plain(tmp_path: Path, sink: Sink) -> None:
    uploader = Uploader(spool_batches(tmp_path, 1), sink.url, "tok", backoff=FAST, compress=False)
    assert uploader.upload_pending(threading.Event())
    assert sink.encodings == ["identity"] and len(sink.stored) == 1
    uploader.transport.close()


def test_send_at_wakes_the_uploader_at_that_time_not_a_round_later(
    tmp_path: Path, sink: Sink
) -> None:
    spool = Spool(tmp_path)
    uploader = Uploader(spool, sink.url, "tok", backoff=FAST, interval_s=60.0)
    stop = threading.Event()
    thread = threading.Thread(target=uploader.run, args=(stop,), daemon=True)
    thread.start()
    try:
        for record in records(2):
            # Seal only once the uploader waits for its time: a batch sealed while it is still
            # draining the previous one is (rightly) sent at once, which is not the case here.
            assert wait_until(lambda: _waiting(uploader), 5)
            spool.append([record], [])
            spool.flush()
            spool.seal(force=True)
            sent_at = time.time() + 0.3
            uploader.send_at(sent_at)
            stored = len(sink.stored) + 1
            assert wait_until(lambda n=stored: len(sink.stored) >= n, 5)  # type: ignore[misc]
            assert sink.arrivals[-1] >= sent_at - 0.01, "not before its time (the jitter)"
            assert sink.arrivals[-1] < sent_at + 2, "and not an interval (60 s) later"
    finally:
        stop.set()
        uploader.wake()
        thread.join(5)
    assert not thread.is_alive()


def _waiting(uploader: Uploader) -> bool:
    """The uploader thread is blocked in its wait for a send time (CPython's Condition keeps
    its waiters in ``_waiters``)."""
    return len(uploader._cond._waiters) > 0  # type: ignore[attr-defined]
