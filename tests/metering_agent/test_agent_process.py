"""The real agent process: SIGKILL and restart on the same spool, SIGTERM, --duration."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from app.core.local_service import free_port
from app.core.processes import wait_until
from metering_agent.nvml.simulated import sim_uuid
from metering_agent.spool import parse_entries
from tests.metering_agent.agent_helpers import (
    Sink,
    assert_no_overlap,
    log_events,
    metrics_page,
    start_agent,
)

pytestmark = pytest.mark.e2e  # real agent processes

STATE_FLAPS = [
    {"at": t + 0.5, "gpu": gpu, "fault": "nvlink_down" if t % 2 else "recover"}
    for t in range(30)
    for gpu in (0, 1)
]  # GPUs 0 and 1 change state every second, so records close (and are spooled) every second


def spooled(spool: Path) -> set[tuple[str, int, int]]:
    """Records durable in the spool directory: sealed batches and the journal."""
    found = set()
    for path in [*(spool / "batches").glob("*.jsonl"), spool / "journal.jsonl"]:
        if path.exists():
            entries, _ = parse_entries(path, path.read_bytes())
            found |= {
                (e["record"]["gpu_uuid"], e["record"]["start"], e["record"]["end"])
                for e in entries
                if "record" in e
            }
    return found


def test_sigkill_then_restart_loses_and_duplicates_nothing(tmp_path: Path, sink: Sink) -> None:
    faults = tmp_path / "faults.json"
    faults.write_text(json.dumps(STATE_FLAPS))
    spool = tmp_path / "spool"
    sink.script = [503, 503, 503]  # the service is down at first: batches pile up
    agent = start_agent(sink, spool, "--simulate", "4", "--faults", str(faults))
    # Killed once the service is back (the 503s used up) and has taken some records.
    assert wait_until(lambda: sink.requests > 3 and len(sink.all_records()) >= 8, 60)
    agent.kill()
    agent.communicate(timeout=10)  # reaps it and closes its pipes
    before_kill = spooled(spool) | {
        (r["gpu_uuid"], r["start"], r["end"]) for r in sink.all_records()
    }
    assert len(before_kill) >= 8, "the first run spooled records"

    restarted = start_agent(
        sink, spool, "--simulate", "4", "--faults", str(faults), "--duration", "4"
    )
    _, stderr = restarted.communicate(timeout=30)
    assert restarted.returncode == 0, stderr

    received = {(r["gpu_uuid"], r["start"], r["end"]) for r in sink.all_records()}
    assert before_kill <= received, f"lost: {sorted(before_kill - received)}"
    spans = assert_no_overlap(sink.all_records())
    assert len(spans) == 4, "same GPUs (stable UUIDs) after the restart"
    assert len({(g, s) for g, s, _ in received}) == len(received), "one end per (gpu, start)"


def test_a_failure_survives_sigkill_and_restart_until_the_gpu_is_repaired(
    tmp_path: Path, sink: Sink
) -> None:
    faults = tmp_path / "faults.json"
    faults.write_text(json.dumps([
        {"at": 1, "gpu": 0, "fault": "xid", "xid": 119},  # GSP timeout: reset the GPU
        {"at": 1, "gpu": 1, "fault": "xid", "xid": 13},  # the customer's own fault
    ]))  # fmt: skip
    spool, models = tmp_path / "spool", "H100 80GB HBM3,A100-SXM4-80GB,L40S"
    gpu = [sim_uuid("test-node", i) for i in range(3)]
    agent = start_agent(
        sink, spool, "--simulate", "3", "--gpu-models", models, "--faults", str(faults)
    )

    def failed_seen() -> bool:
        return any(r["gpu_uuid"] == gpu[0] and r["state"] == "failed" for r in sink.all_records())

    assert wait_until(failed_seen, 30)
    agent.kill()
    agent.communicate(timeout=10)
    killed_at = time.time()
    assert json.loads((spool / "latch.json").read_text())["gpus"].keys() == {gpu[0]}

    # The restarted agent has no fault script: nothing on the node says the GPU was reset.
    restarted = start_agent(
        sink, spool, "--simulate", "3", "--gpu-models", models, "--duration", "4"
    )
    _, stderr = restarted.communicate(timeout=30)
    assert restarted.returncode == 0, stderr
    after = [r for r in sink.all_records() if r["start"] >= killed_at]
    assert {r["state"] for r in after if r["gpu_uuid"] == gpu[0]} == {"failed"}
    assert {r["state"] for r in after if r["gpu_uuid"] != gpu[0]} == {"healthy"}
    changes = [e for e in sink.events() if e["kind"] == "state_change" and e["gpu_uuid"] == gpu[0]]
    assert [e["state"] for e in changes] == ["failed"], "the restart reports no change"
    assert "latch_restored" in {line["event"] for line in log_events(stderr)}


def test_sigterm_flushes_open_records_and_exits_0(tmp_path: Path, sink: Sink) -> None:
    port = free_port()
    agent = start_agent(
        sink, tmp_path / "spool", "--simulate", "2", "--metrics-port", str(port),
        "--metrics-host", "127.0.0.1",
    )  # fmt: skip
    metrics = b""

    def sampled() -> bool:
        nonlocal metrics
        metrics = metrics_page(port, timeout_s=5) or b""  # empty: not listening yet
        return b"gpumeter_gpu_utilization_percent{gpu=" in metrics

    assert wait_until(sampled, 30), metrics
    assert b"gpumeter_agent_spool_bytes" in metrics
    agent.send_signal(signal.SIGTERM)
    stopped_at = time.time()
    _, stderr = agent.communicate(timeout=20)
    assert agent.returncode == 0, stderr
    spans = assert_no_overlap(sink.all_records())
    assert len(spans) == 2
    for intervals in spans.values():
        assert intervals[-1][1] >= int(stopped_at) - 1, "the open record was flushed and sent"
        seconds = [s for a, b in intervals for s in range(a, b)]
        assert seconds == list(range(seconds[0], seconds[-1] + 1)), "no gaps"
    logs = log_events(stderr)
    assert all({"ts", "level", "event"} <= set(line) for line in logs)
    [stopped] = [line for line in logs if line["event"] == "agent_stopped"]
    assert stopped["batches_left"] == 0


def test_rejected_batches_do_not_stop_the_agent(tmp_path: Path, sink: Sink) -> None:
    sink.script = [400]
    agent = start_agent(sink, tmp_path / "spool", "--simulate", "1", "--duration", "3")
    _, stderr = agent.communicate(timeout=30)
    assert agent.returncode == 0, stderr
    assert {line["event"] for line in log_events(stderr)} >= {
        "batch_rejected",
        "batch_dead_lettered",
    }
    assert len(list((tmp_path / "spool" / "dead-letter").iterdir())) == 1
