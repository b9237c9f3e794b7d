"""End to end: real agents with simulated GPUs and faults, against the real service."""

from __future__ import annotations

import signal
import time
from typing import Any

import pytest

from metering_agent.nvml.simulated import sim_uuid
from tests.e2e.conftest import Fleet, assert_exact_cover, seconds, stop

pytestmark = pytest.mark.e2e

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


def test_service_down_30s_every_second_arrives_exactly_once(fleet: Fleet) -> None:
    t0 = int(time.time())
    agent = fleet.agent("node-c", fleet.node("node-c"), "--simulate", "2", "--duration", "45")
    time.sleep(8)
    fleet.service.stop()
    time.sleep(30)
    fleet.service.start()
    wait(agent, 60)
    t1 = int(time.time()) + 1
    for gpu in metered_gpus(fleet, "node-c", 2):
        timeline = fleet.timeline(gpu, t0, t1)
        assert_exact_cover(timeline, t0, t1)
        inner = [g for g in timeline["unmetered"] if t0 < g["start_s"] and g["end_s"] < t1]
        assert inner == [], inner  # nothing lost while the service was down
        metered = seconds(timeline["segments"])
        assert metered >= 40
        points = fleet.get(f"/v1/gpus/{gpu}/metrics?start={t0 - t0 % 60}&end={t1 + 60}")
        # each second counted once in the minute metrics too (no record stored twice)
        assert sum(p["observed_s"] for p in points["points"]) == metered
    assert not list((fleet.tmp / "spool-node-c" / "dead-letter").iterdir())


def test_killed_agent_leaves_an_unmetered_gap_and_no_overlap(fleet: Fleet) -> None:
    token = fleet.node("node-d")
    t0 = int(time.time())
    first = fleet.agent("node-d", token, "--simulate", "2", "--duration", "60")
    time.sleep(10)
    stop(first, signal.SIGKILL)
    killed_at = int(time.time())
    time.sleep(6)
    restarted_at = int(time.time())
    second = fleet.agent("node-d", token, "--simulate", "2", "--duration", "10")
    wait(second, 40)
    t1 = int(time.time()) + 1
    for gpu in metered_gpus(fleet, "node-d", 2):
        timeline = fleet.timeline(gpu, t0, t1)
        assert_exact_cover(timeline, t0, t1)  # no overlap: segments never double-count
        # The open record (up to a minute) dies with the agent: the gap begins at the last
        # spooled record and lasts until the restarted agent's first second.
        gaps = [
            g
            for g in timeline["unmetered"]
            if g["start_s"] <= killed_at and g["end_s"] >= restarted_at
        ]
        assert len(gaps) == 1 and gaps[0]["end_s"] < t1 - 5, timeline["unmetered"]
    assert not list((fleet.tmp / "spool-node-d" / "dead-letter").iterdir())
