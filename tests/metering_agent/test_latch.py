"""A hardware failure holds until the GPU is seen repaired, across agent restarts: the latch is in
the spool directory. Runs the real runner, spool and latch store over a scripted provider (the
readings a node's NVML would give), several GPUs of several models, with a fake clock."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from metering_agent import cli
from metering_agent.latch import LatchStore
from metering_agent.metrics import Metrics
from metering_agent.nvml.provider import GpuInfo, GpuReading
from metering_agent.runner import Runner
from metering_agent.spool import Spool, read_batch
from tests.metering_agent.agent_helpers import FakeClock

BOOT = "3f1c2b0e-0000-4000-8000-000000000001"
GPUS = [
    GpuInfo(0, "GPU-aaaaaaaa-0000-0000-0000-000000000000", "NVIDIA H100 80GB HBM3"),
    GpuInfo(1, "GPU-bbbbbbbb-0000-0000-0000-000000000000", "NVIDIA A100-SXM4-80GB"),
    GpuInfo(2, "GPU-cccccccc-0000-0000-0000-000000000000", "NVIDIA L40S"),
]


@dataclass
class Node:
    """Three GPUs whose energy counters run on; ``xids`` and ``reset`` script what happens."""

    energy: list[int] = field(default_factory=lambda: [5_000_000, 7_000_000, 9_000_000])
    xids: dict[int, list[int]] = field(default_factory=dict)  # GPU -> XIDs of the next reading

    def gpus(self) -> list[GpuInfo]:
        return GPUS

    def read_all(self) -> list[GpuReading]:
        readings = []
        for info in GPUS:
            self.energy[info.index] += 400_000
            readings.append(
                GpuReading(
                    info.index,
                    info.uuid,
                    info.name,
                    gpu_util=90,
                    recovery_action=0,
                    energy_mj=self.energy[info.index],
                    ecc_uncorrected_volatile=0,
                    xids=self.xids.pop(info.index, []),
                )
            )
        return readings

    def reset(self, gpu: int) -> None:
        """A GPU reset by the driver reload that came with it: the energy counter restarts."""
        self.energy[gpu] = 0

    def close(self) -> None:
        pass


def run_agent(root: Path, node: Node, seconds: int, *, boot: str = BOOT, clock: FakeClock) -> Spool:
    metrics = Metrics()
    spool = Spool(root, metrics=metrics, clock=clock.mono)
    runner = Runner(
        node, spool, clock=clock, metrics=metrics, latches=LatchStore(root, boot_id=boot)
    )
    runner.run(threading.Event(), duration_s=seconds)
    runner.close()
    spool.seal(force=True)
    spool.close()
    return spool


def states(spool: Spool, gpu: int) -> list[str]:
    """The GPU's state for every second spooled, in order (all batches so far)."""
    records = [r for p in spool.batches() for r in read_batch(p)["records"]]
    mine = sorted((r for r in records if r["gpu_uuid"] == GPUS[gpu].uuid), key=lambda r: r["start"])
    return [r["state"] for r in mine for _ in range(r["end"] - r["start"])]


def changes(spool: Spool, gpu: int) -> list[dict]:
    events = [e for p in spool.batches() for e in read_batch(p)["events"]]
    return [e for e in events if e["kind"] == "state_change" and e["gpu_uuid"] == GPUS[gpu].uuid]


def fail_gpu_0(tmp_path: Path, clock: FakeClock) -> Node:
    node = Node(xids={0: [119], 1: [13]})  # a GSP timeout on the H100, an app fault on the A100
    spool = run_agent(tmp_path, node, 6, clock=clock)
    assert set(states(spool, 0)) == {"failed"} and set(states(spool, 1)) == {"healthy"}
    return node


def test_a_restart_keeps_the_failure_until_the_gpu_is_reset(tmp_path: Path) -> None:
    clock = FakeClock()
    node = fail_gpu_0(tmp_path, clock)
    latched = json.loads((tmp_path / "latch.json").read_text())
    assert latched["boot_id"] == BOOT and list(latched["gpus"]) == [GPUS[0].uuid]
    assert [h["rule"] for h in latched["gpus"][GPUS[0].uuid]["held"]] == ["xid_119_gsp_rpc_timeout"]

    clock.sleep(600, threading.Event())  # the agent is down ten minutes; nobody resets the GPU
    spool = run_agent(tmp_path, node, 8, clock=clock)
    assert set(states(spool, 0)) == {"failed"}, "still failed after the restart"
    assert len(changes(spool, 0)) == 1, "no new state change: the failure goes on"

    node.reset(0)
    spool = run_agent(tmp_path, node, 4, clock=clock)
    assert states(spool, 0)[-4:] == ["healthy"] * 4
    repaired = changes(spool, 0)[-1]
    assert (repaired["state"], repaired["detail"]["repaired"]) == ("healthy", "energy_mj_went_down")
    assert json.loads((tmp_path / "latch.json").read_text())["gpus"] == {}
    assert set(states(spool, 1)) == set(states(spool, 2)) == {"healthy"}


@dataclass
class NodeMissing(Node):
    """The failed GPU does not enumerate for the first ``missing`` readings after a restart."""

    missing: int = 0

    def read_all(self) -> list[GpuReading]:
        readings = super().read_all()
        if self.missing > 0:
            self.missing -= 1
            return readings[1:]
        return readings


def test_a_gpu_unreadable_after_the_restart_keeps_its_latch(tmp_path: Path) -> None:
    clock = FakeClock()
    node = fail_gpu_0(tmp_path, clock)
    missing = NodeMissing(energy=node.energy, missing=3)
    run_agent(tmp_path, missing, 2, clock=clock)
    assert GPUS[0].uuid in json.loads((tmp_path / "latch.json").read_text())["gpus"]
    spool = run_agent(tmp_path, missing, 4, clock=clock)
    assert set(states(spool, 0)) == {"failed"}


def test_the_operator_clears_a_repair_the_agent_cannot_see(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    clock = FakeClock()
    node = fail_gpu_0(tmp_path, clock)
    assert cli.main(["--clear-latch", GPUS[1].uuid, "--spool-dir", str(tmp_path)]) == 1
    assert json.loads(capsys.readouterr().out) == {"cleared": [], "not_latched": [GPUS[1].uuid]}
    assert cli.main(["--clear-latch", GPUS[0].uuid, "--spool-dir", str(tmp_path)]) == 0
    assert json.loads(capsys.readouterr().out)["cleared"] == [GPUS[0].uuid]
    spool = run_agent(tmp_path, node, 3, clock=clock)
    assert states(spool, 0)[-3:] == ["healthy"] * 3
    repaired = changes(spool, 0)[-1]
    assert (repaired["state"], repaired["detail"]["repaired"]) == ("healthy", "operator_cleared")


def test_a_node_reboot_is_the_repair(tmp_path: Path) -> None:
    clock = FakeClock()
    node = fail_gpu_0(tmp_path, clock)
    spool = run_agent(tmp_path, node, 3, boot="3f1c2b0e-0000-4000-8000-000000000002", clock=clock)
    assert states(spool, 0)[-3:] == ["healthy"] * 3
    repaired = changes(spool, 0)[-1]
    assert (repaired["state"], repaired["detail"]["repaired"]) == ("healthy", "node_rebooted")


def test_an_unreadable_latch_file_is_moved_aside_and_the_agent_runs(tmp_path: Path) -> None:
    clock = FakeClock()
    (tmp_path / "latch.json").write_text('{"boot_id": "x", "gpus": {"GPU-a": {"held": 7}}}')
    spool = run_agent(tmp_path, Node(), 3, clock=clock)
    assert set(states(spool, 0)) == {"healthy"}
    assert [p.name.startswith("latch.json.unreadable-") for p in tmp_path.glob("latch.json.*")] == [
        True
    ]


def test_an_unknown_xid_is_shown_and_counted(tmp_path: Path) -> None:
    clock, metrics = FakeClock(), Metrics()
    spool = Spool(tmp_path, metrics=metrics, clock=clock.mono)
    node = Node(xids={2: [999, 999]})
    Runner(node, spool, clock=clock, metrics=metrics).run(threading.Event(), duration_s=3)
    spool.seal(force=True)
    assert metrics.get("gpumeter_agent_unknown_xids_total", code="999") == 2
    events = [e for p in spool.batches() for e in read_batch(p)["events"]]
    unknown = [e for e in events if e["kind"] == "xid_unknown"]
    assert [(e["gpu_uuid"], e["code"]) for e in unknown] == [(GPUS[2].uuid, 999)] * 2
    assert states(spool, 2)[0] == "degraded"


def test_boot_id_is_read_from_the_kernel(tmp_path: Path) -> None:
    from metering_agent.latch import read_boot_id

    path = tmp_path / "boot_id"
    path.write_text(f"{BOOT}\n")
    assert read_boot_id(path) == BOOT
    assert read_boot_id(tmp_path / "missing") is None
