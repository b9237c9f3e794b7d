"""The real agent process under faults: a shedding service, a full disk, a corrupt spool, a
frozen process. Each test fails on the agent before issue 12."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from email.utils import formatdate
from pathlib import Path
from typing import Any

import pytest

from app.core.local_service import free_port
from app.core.processes import stop_child, wait_until
from tests.metering_agent.agent_helpers import Sink, assert_no_overlap, log_events, scrape
from tests.metering_agent.agent_helpers import start_agent as start_agent_process

pytestmark = pytest.mark.e2e
Agent = subprocess.Popen[str]
_started: list[Agent] = []


@pytest.fixture(autouse=True)
def _no_agent_left_running() -> Iterator[None]:
    yield
    while _started:
        agent = _started.pop()
        if agent.poll() is None:  # the test failed half-way
            stop_child(agent, "agent", sig=signal.SIGKILL)
        agent.communicate(timeout=10)  # closes its pipes, also of one that ended by itself


def start_agent(sink: Sink, spool: Path, *args: str) -> Agent:
    agent = start_agent_process(sink, spool, *args)
    _started.append(agent)
    return agent


def flaps(gpus: int, seconds: int = 120) -> list[dict[str, Any]]:
    """Every GPU changes state every second, so each second closes (and spools) a record."""
    return [
        {"at": t + 0.5, "gpu": gpu, "fault": "nvlink_down" if t % 2 else "recover"}
        for t in range(seconds)
        for gpu in range(gpus)
    ]


def stop(agent: Agent) -> list[dict[str, Any]]:
    agent.send_signal(signal.SIGTERM)
    _, stderr = agent.communicate(timeout=30)
    assert agent.returncode == 0, stderr
    return log_events(stderr)


def seconds_by_gpu(sink: Sink) -> dict[str, list[int]]:
    spans = assert_no_overlap(sink.all_records())
    return {gpu: [s for a, b in iv for s in range(a, b)] for gpu, iv in spans.items()}


def unmetered(sink: Sink, reason: str) -> list[dict[str, Any]]:
    return [e for e in sink.events() if e["kind"] == "unmetered" and e["rule"] == reason]


# -- 503 / Retry-After ---------------------------------------------------------------------


def test_503_retry_after_is_honoured_with_jitter(tmp_path: Path, sink: Sink) -> None:
    in_3_s = lambda: (503, {"Retry-After": formatdate(time.time() + 3, usegmt=True)})  # noqa: E731
    sink.script = [(503, {"Retry-After": "2"})] * 3 + [in_3_s]
    faults = tmp_path / "faults.json"
    faults.write_text(json.dumps(flaps(1)))
    # --backoff-max 1 (agent_cmd): without Retry-After the agent would retry within 1 s
    agent = start_agent(sink, tmp_path / "spool", "--simulate", "1", "--faults", str(faults))
    assert wait_until(lambda: bool(sink.stored), 30), "the batch stored once the service takes it"
    logs = stop(agent)
    gaps = [b - a for a, b in itertools.pairwise(sink.request_times[:5])]
    assert all(2.0 <= g <= 2 * 1.5 + 1 for g in gaps[:3]), gaps  # Retry-After 2, jittered
    assert 2.0 <= gaps[3] <= 3 * 1.5 + 1, gaps  # the HTTP-date 3 s ahead (1 s resolution)
    assert len({round(g, 2) for g in gaps[:3]}) > 1, f"no jitter: {gaps}"
    told = [line["retry_after_s"] for line in logs if line["event"] == "upload_failed"]
    assert told[:3] == [2.0, 2.0, 2.0]


# -- disk full -------------------------------------------------------------------------------


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A real 200 KB file system (tmpfs), as in the reproduction."""
    mount = tmp_path / "fs"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=200k", "tmpfs", str(mount)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=True)


def fill(mount: Path, leave_bytes: int) -> Path:
    """Fill the file system up to ``leave_bytes`` of free space, as another program would."""
    st = os.statvfs(mount)
    filler = mount / "filler"
    filler.write_bytes(b"\0" * (st.f_bavail * st.f_frsize - leave_bytes))
    return filler


def run_until_disk_full(sink: Sink, mount: Path, gpus: int, *args: str) -> tuple[Agent, int, Path]:
    """Start the agent on a nearly full disk with the service down; return once it is full."""
    faults = mount.parent / "faults.json"
    faults.write_text(json.dumps(flaps(gpus)))
    filler = fill(mount, 24 * 1024)
    sink.down = 503  # batches pile up on the small disk
    port = free_port()
    agent = start_agent(
        sink, mount / "spool", "--simulate", str(gpus), "--faults", str(faults),
        "--metrics-port", str(port), "--metrics-host", "127.0.0.1", *args,
    )  # fmt: skip
    assert wait_until(lambda: scrape(port).get("gpumeter_agent_spool_full") == 1, 60), "full"
    return agent, port, filler


def recover_space(sink: Sink, port: int, filler: Path) -> None:
    filler.unlink()
    sink.down = None
    assert wait_until(
        lambda: (
            bool(m := scrape(port))
            and m["gpumeter_agent_spool_full"] == 0
            and m["gpumeter_agent_spool_held_items"] == 0
            and m["gpumeter_agent_spool_batches"] == 0
        ),
        60,
    ), "the held items written and every batch uploaded"


def test_disk_full_holds_items_in_memory_and_loses_nothing(small_fs: Path, sink: Sink) -> None:
    agent, port, filler = run_until_disk_full(sink, small_fs, gpus=8)
    assert wait_until(
        lambda: scrape(port).get("gpumeter_agent_spool_held_items", 0) >= 40,
        30,
    ), "items held in memory while the disk is full"
    recover_space(sink, port, filler)
    logs = stop(agent)
    full = [line for line in logs if line["event"] == "spool_full"]
    assert full and full[0]["reason"] == "disk_full" and full[0]["level"] == "error"
    assert "spool_space_available" in {line["event"] for line in logs}
    assert not [line for line in logs if line["event"] == "tick_failed"]
    for gpu, seconds in seconds_by_gpu(sink).items():
        assert seconds == list(range(seconds[0], seconds[-1] + 1)), f"{gpu}: a gap"
    assert not unmetered(sink, "spool_full"), "nothing was dropped"
    assert not list(small_fs.rglob("*.tmp")), "no temporary file left behind"


def test_beyond_the_memory_bound_the_loss_is_reported_as_unmetered(
    small_fs: Path, sink: Sink
) -> None:
    agent, port, filler = run_until_disk_full(sink, small_fs, 4, "--spool-max-memory-bytes", "6000")
    assert wait_until(
        lambda: scrape(port).get("gpumeter_agent_spool_dropped_items_total", 0) >= 30,
        30,
    ), "items dropped beyond the memory bound"
    recover_space(sink, port, filler)
    assert wait_until(lambda: len(unmetered(sink, "spool_full")) == 4, 30), "a report per GPU"
    dropped = scrape(port)["gpumeter_agent_spool_dropped_items_total"]
    logs = stop(agent)
    assert {"spool_dropping", "spool_items_dropped"} <= {line["event"] for line in logs}
    events = {e["gpu_uuid"]: e for e in unmetered(sink, "spool_full")}
    assert sum(e["detail"]["records_lost"] + e["detail"]["events_lost"] for e in events.values())
    assert dropped == sum(
        e["detail"]["records_lost"] + e["detail"]["events_lost"] for e in events.values()
    )
    for gpu, seconds in seconds_by_gpu(sink).items():
        d = events[gpu]["detail"]
        assert d["seconds"] == d["end"] - d["start"] > 0
        lost = set(range(d["start"], d["end"]))
        assert not lost & set(seconds), f"{gpu}: a dropped second was also delivered"
        covered = sorted(lost | set(seconds))
        assert covered == list(range(covered[0], covered[-1] + 1)), f"{gpu}: unexplained gap"


# -- corrupt spool ---------------------------------------------------------------------------


def good_line(gpu: str = "GPU-kept") -> bytes:
    start = int(time.time()) - 100
    record = {"gpu_uuid": gpu, "model": "H100", "start": start, "end": start + 1}
    return json.dumps({"record": {**record, "state": "healthy", "sample_count": 1}}).encode()


LEGACY_BATCH = f"batches/0000000001-{uuid.uuid4()}.json"
CORRUPTIONS = {  # the file written into the spool -> its content
    "state_json_empty": ("state.json", b""),
    "state_json_garbage": ("state.json", b"\x00\xffnot json{"),
    "batch_holding_a_list": (LEGACY_BATCH, b"[]"),
    "journal_line_42": ("journal.jsonl", good_line() + b"\n42\n"),
    "record_without_end": (
        "journal.jsonl",
        good_line() + b"\n" + good_line("GPU-torn").replace(b', "end"', b', "ends"') + b"\n",
    ),
}


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_corrupt_spool_is_quarantined_and_the_agent_starts(
    case: str, tmp_path: Path, sink: Sink
) -> None:
    spool = tmp_path / "spool"
    (spool / "batches").mkdir(parents=True)
    name, content = CORRUPTIONS[case]
    (spool / name).write_bytes(content)
    if name != "journal.jsonl":
        (spool / "journal.jsonl").write_bytes(good_line() + b"\n")
    agent = start_agent(sink, spool, "--simulate", "1", "--duration", "2")
    _, stderr = agent.communicate(timeout=30)
    assert agent.returncode == 0, stderr
    [quarantined] = (spool / "quarantine").iterdir()
    assert quarantined.read_bytes() == content, "moved aside as it was"
    [logged] = [line for line in log_events(stderr) if line["event"] == "spool_quarantined"]
    assert logged["file"] == Path(name).name and logged["level"] == "error"
    kept = [r for r in sink.all_records() if r["gpu_uuid"] == "GPU-kept"]
    assert len(kept) == 1, "what could be read was kept and sent"
    assert not [r for r in sink.all_records() if r["gpu_uuid"] == "GPU-torn"]


# -- frozen process --------------------------------------------------------------------------


def test_a_frozen_agent_reports_the_gap_with_its_length(tmp_path: Path, sink: Sink) -> None:
    faults = tmp_path / "faults.json"
    faults.write_text(json.dumps(flaps(2)))
    agent = start_agent(sink, tmp_path / "spool", "--simulate", "2", "--faults", str(faults))
    assert wait_until(lambda: bool(sink.all_records()), 30), "the agent metering"
    agent.send_signal(signal.SIGSTOP)
    frozen_at = time.monotonic()
    while time.monotonic() < frozen_at + 4:  # the fault itself: 4 s frozen
        time.sleep(0.1)
    agent.send_signal(signal.SIGCONT)
    assert wait_until(lambda: len(unmetered(sink, "agent_paused")) == 2, 30), "gap reported"
    logs = stop(agent)
    assert "sampling_gap" in {line["event"] for line in logs}
    events = {e["gpu_uuid"]: e for e in unmetered(sink, "agent_paused")}
    for gpu, seconds in seconds_by_gpu(sink).items():
        d = events[gpu]["detail"]
        assert 3 <= d["seconds"] == d["end"] - d["start"] <= 5, d
        assert events[gpu]["at"] == d["start"]
        gap = set(range(d["start"], d["end"]))
        assert not gap & set(seconds), "no second both metered and reported missing"
        assert sorted(gap | set(seconds)) == list(range(seconds[0], seconds[-1] + 1))
