"""The simulator and its fault scripts."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from metering_agent.classifier import HealthMemory, classify
from metering_agent.faults import FaultScriptError, load_faults, parse_faults
from metering_agent.nvml.simulated import SimulatedProvider, sim_uuid
from metering_agent.protocol import GpuState

UUID_RE = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


class Ticker:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def provider(faults: list[dict], gpus: int = 2, **kw: object) -> tuple[SimulatedProvider, Ticker]:
    clock = Ticker()
    sim = SimulatedProvider(gpus, seed=7, faults=parse_faults(faults), clock=clock, **kw)  # type: ignore[arg-type]
    return sim, clock


def test_uuids_are_stable_per_node_and_index_and_prefix() -> None:
    assert UUID_RE.match(sim_uuid("node-a", 0))
    assert sim_uuid("node-a", 0) == sim_uuid("node-a", 0)
    assert len({sim_uuid("node-a", 0), sim_uuid("node-a", 1), sim_uuid("node-b", 0)}) == 3
    assert sim_uuid("node-a", 0, "agent-2") != sim_uuid("node-a", 0)


def test_models_round_robin_and_readings_vary() -> None:
    sim, clock = provider([], gpus=3, models=["H100 80GB HBM3", "NVIDIA L40S"])
    h100, l40s = "NVIDIA H100 80GB HBM3", "NVIDIA L40S"
    assert [g.name for g in sim.gpus()] == [h100, l40s, h100]
    utils, energy = set(), []
    for _ in range(10):
        clock.t += 1
        r = sim.read_all()[1]
        assert r.gpu_util is not None and r.power_mw is not None and r.energy_mj is not None
        utils.add(r.gpu_util)
        energy.append(r.energy_mj)
        assert r.nvlink_links is None and "nvlink_links" in r.unsupported  # PCIe card
        assert 0 <= r.gpu_util <= 100 and r.power_mw > 0
    assert len(utils) > 3 and energy == sorted(energy)


def test_faults_apply_at_their_time_and_recover_clears_them() -> None:
    sim, clock = provider(
        [
            {"at": 1, "gpu": 0, "fault": "xid", "xid": 48},
            {"at": 2, "gpu": 1, "fault": "thermal_slowdown", "duration": 2},
            {"at": 3, "gpu": 0, "fault": "nvlink_down", "count": 2},
            {"at": 5, "gpu": 0, "fault": "recover"},
        ]
    )
    seen = []
    for t in range(7):
        clock.t = t
        seen.append(sim.read_all())
    assert seen[0][0].xids == [] and seen[1][0].xids == [48] and seen[2][0].xids == []
    assert seen[1][0].ecc_uncorrected_volatile == 1, "XID 48 comes with a DBE count"
    assert seen[2][1].clock_event_reasons and seen[3][1].clock_event_reasons
    assert not seen[4][1].clock_event_reasons, "the slowdown ends after its duration"
    assert seen[4][0].nvlink_links_down == 2
    assert seen[5][0].recovered and seen[5][0].ecc_uncorrected_volatile == 0
    assert seen[5][0].nvlink_links_down == 0 and not seen[6][0].recovered


def test_xid_79_makes_the_gpu_lost() -> None:
    sim, _ = provider([{"at": 0, "gpu": 1, "fault": "xid", "xid": 79}])
    r = sim.read_all()[1]
    assert r.lost and r.xids == [79] and r.gpu_util is None


@pytest.mark.parametrize(
    ("fault", "state", "rule"),
    [
        ({"fault": "dbe"}, GpuState.FAILED, "ecc_uncorrected_volatile"),  # uncontained
        ({"fault": "xid", "xid": 94}, GpuState.DEGRADED, "ecc_uncorrected_contained"),
    ],
)
def test_simulated_memory_errors_follow_the_ampere_rules(
    fault: dict[str, object], state: GpuState, rule: str
) -> None:
    sim, _ = provider([{"at": 0, "gpu": 0, **fault}])
    verdict, _ = classify(sim.read_all()[0], HealthMemory(), 1_700_000_000)
    assert verdict.state == state and verdict.evidence[0].rule == rule


@pytest.mark.parametrize(
    "script",
    [
        {"at": 1},
        [{"at": 1, "gpu": 0, "fault": "meltdown"}],
        [{"at": 1, "gpu": 0, "fault": "xid"}],
        [{"gpu": 0, "fault": "dbe"}],
        ["xid"],
    ],
)
def test_bad_fault_scripts_are_refused(script: object) -> None:
    with pytest.raises(FaultScriptError):
        parse_faults(script)


def test_load_faults_sorts_by_time(tmp_path: Path) -> None:
    path = tmp_path / "faults.json"
    path.write_text(
        json.dumps(
            [
                {"at": 9, "gpu": 0, "fault": "recover"},
                {"at": 2.5, "gpu": 0, "fault": "dbe", "count": 3},
            ]
        )
    )
    faults = load_faults(path)
    assert [(f.at, f.fault, f.count) for f in faults] == [(2.5, "dbe", 3), (9.0, "recover", 1)]
