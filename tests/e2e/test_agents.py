"""End to end: real agents with simulated GPUs and faults, against the real service."""

from __future__ import annotations

import signal
import time
from typing import Any

import pytest

from app.core.local_service import free_port
from app.core.processes import stop_child, wait_until
from metering_agent.nvml.simulated import sim_uuid
from tests.e2e.conftest import Fleet, assert_exact_cover, seconds

pytestmark = pytest.mark.e2e
OUTAGE_S = 8  # four times the agents' --backoff-max 2: several failed retries, not one

FAULTS = [
    {"at": 4, "gpu": 0, "fault": "xid", "xid": 79},
    {"at": 6, "gpu": 1, "fault": "dbe", "count": 2},
]


def wait(process: Any, timeout: float) -> None:
    assert process.wait(timeout=timeout) == 0


def metered_gpus(fleet: Fleet, node: str, count: int) -> list[str]:
    """The node's simulated GPUs (index order), each registered by the agent's reports."""
    gpus = [sim_uuid(node, i, node) for i in range(count)]
    assert {g["uuid"] for g in fleet.gpus()} >= set(gpus)
    return gpus


def metered_seconds(fleet: Fleet, node: str, count: int, since: int) -> int:
    """The fewest seconds stored for any of the node's GPUs since ``since`` (0 if unknown)."""
    gpus = [sim_uuid(node, i, node) for i in range(count)]
    if not {g["uuid"] for g in fleet.gpus()} >= set(gpus):
        return 0
    now = int(time.time()) + 1
    return min(seconds(fleet.timeline(gpu, since, now)["segments"]) for gpu in gpus)


def test_two_agents_with_faults_account_for_every_second(fleet: Fleet) -> None:
    t0 = int(time.time())
    agents = [
        fleet.agent(name, fleet.node(name), "--simulate", "3", "--duration", "14", faults=FAULTS)
        for name in ("node-a", "node-b")
    ]
    for agent in agents:
        wait(agent, 40)
    t1 = int(time.time()) + 1
    gpus = metered_gpus(fleet, "node-a", 3) + metered_gpus(fleet, "node-b", 3)
    for gpu in gpus:
        timeline = fleet.timeline(gpu, t0, t1)
        assert_exact_cover(timeline, t0, t1)
        assert seconds(timeline["segments"]) >= 10  # metered while the agent ran
    failed = [
        (gpu, s)
        for gpu in gpus
        for s in fleet.timeline(gpu, t0, t1)["segments"]
        if s["state"] == "failed"
    ]
    # GPU 0 of each node fell off the bus (XID 79), GPU 1 had uncorrectable ECC errors.
    expected = {gpus[0]: "gpu_lost", gpus[1]: "ecc_uncorrected_volatile"}
    expected |= {gpus[3]: "gpu_lost", gpus[4]: "ecc_uncorrected_volatile"}
    assert {gpu: s["evidence"]["rule"] for gpu, s in failed} == expected
    assert all(s["evidence"]["event_id"] for _, s in failed)


def test_service_down_every_second_arrives_exactly_once(fleet: Fleet) -> None:
    t0 = int(time.time())
    port = free_port()
    agent = fleet.agent(
        "node-c", fleet.node("node-c"), "--simulate", "2", "--metrics-port", str(port),
        "--metrics-host", "127.0.0.1",
    )  # fmt: skip

    def counter(metric: str) -> float:  # counters only: the agent prints 6 digits (:g)
        return fleet.agent_metric(port, f"gpumeter_agent_{metric}")

    assert wait_until(lambda: counter("batches_uploaded_total") > 0, 60), "uploading before"
    fleet.service.stop()
    down_at, errors_before = time.monotonic(), counter("upload_errors_total")
    # Down for OUTAGE_S, during which the agent kept trying (and spooling).
    assert wait_until(
        lambda: (
            time.monotonic() - down_at >= OUTAGE_S
            and counter("upload_errors_total") >= errors_before + 3
        ),
        OUTAGE_S + 60,
    )
    uploaded_before = counter("batches_uploaded_total")
    fleet.service.start()
    assert wait_until(
        lambda: (
            counter("batches_uploaded_total") > uploaded_before and counter("spool_batches") == 0
        ),
        60,
    ), "the spool drained after the service came back"
    assert stop_child(agent, "agent node-c") == 0  # SIGTERM: flushes the open records
    t1 = int(time.time()) + 1
    for gpu in metered_gpus(fleet, "node-c", 2):
        timeline = fleet.timeline(gpu, t0, t1)
        assert_exact_cover(timeline, t0, t1)
        inner = [g for g in timeline["unmetered"] if t0 < g["start_s"] and g["end_s"] < t1]
        assert inner == [], inner  # nothing lost while the service was down
        metered = seconds(timeline["segments"])
        assert metered >= OUTAGE_S
        points = fleet.get(f"/v1/gpus/{gpu}/metrics?start={t0 - t0 % 60}&end={t1 + 60}")
        # each second counted once in the minute metrics too (no record stored twice)
        assert sum(p["observed_s"] for p in points["points"]) == metered
    assert not list((fleet.tmp / "spool-node-c" / "dead-letter").iterdir())


def test_killed_agent_loses_at_most_its_open_round_and_no_overlap(fleet: Fleet) -> None:
    token = fleet.node("node-d")
    t0 = int(time.time())
    first = fleet.agent("node-d", token, "--simulate", "2", "--duration", "60")
    assert wait_until(lambda: metered_seconds(fleet, "node-d", 2, t0) >= 5, 60), fleet.gpus()
    before_kill = int(time.time())
    stop_child(first, "agent node-d", sig=signal.SIGKILL)
    killed_at = int(time.time())  # restarted at once: the gap is what the kill lost
    second = fleet.agent("node-d", token, "--simulate", "2", "--duration", "10")
    wait(second, 40)
    t1 = int(time.time()) + 1
    for gpu in metered_gpus(fleet, "node-d", 2):
        timeline = fleet.timeline(gpu, t0, t1)
        assert_exact_cover(timeline, t0, t1)  # no overlap: segments never double-count
        # The seconds since the last cut (at most an upload interval) die with the agent: at
        # most one gap, from the last spooled record to the restarted agent's first second.
        # A kill just after a cut, restarted within the second, loses none.
        gaps = [
            g
            for g in timeline["unmetered"]
            if g["start_s"] <= killed_at + 1 and g["end_s"] >= before_kill
        ]
        assert len(gaps) <= 1 and all(g["end_s"] < t1 - 5 for g in gaps), timeline["unmetered"]
    assert not list((fleet.tmp / "spool-node-d" / "dead-letter").iterdir())
