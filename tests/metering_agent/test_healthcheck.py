"""``gpumeter-agent --health-check``'s findings: the agent's latched failures (gone once the node
rebooted) and one reading now classified by the agent's rules. Draining and resuming a real
Slurm node: tests/e2e/test_slurm.py."""

from __future__ import annotations

from pathlib import Path

from metering_agent.classifier import LATCHED, Evidence, HealthMemory
from metering_agent.healthcheck import Finding, NodeStatus, latched, probed, reason
from metering_agent.latch import LatchStore
from metering_agent.nvml.provider import GpuInfo, GpuReading
from metering_agent.protocol import GpuState

BOOT, LATER_BOOT = "boot-1", "boot-2"
FAILED = Evidence("xid_79_gpu_has_fallen_off_the_bus", GpuState.FAILED, "gpu_lost", 79, {})
DEGRADED = Evidence("ecc_dbe_contained", GpuState.DEGRADED, "contained_ecc", None, {})


def _latch(spool: Path, memories: dict[str, HealthMemory]) -> None:
    LatchStore(spool, boot_id=BOOT).update(memories)


def test_a_latched_failure_fails_the_check_until_the_node_reboots(tmp_path: Path) -> None:
    _latch(tmp_path, {
        "GPU-a": HealthMemory(GpuState.FAILED, {}, {FAILED.rule: (FAILED, LATCHED)}),
        "GPU-b": HealthMemory(GpuState.DEGRADED, {}, {DEGRADED.rule: (DEGRADED, LATCHED)}),
    })  # fmt: skip
    assert LatchStore(tmp_path, boot_id=BOOT).failed() == {"GPU-a": [FAILED.rule]}
    assert LatchStore(tmp_path, boot_id=LATER_BOOT).failed() == {}  # the reboot repaired it
    (tmp_path / "latch.json").write_text("{not json")
    assert LatchStore(tmp_path, boot_id=BOOT).failed() == {}
    assert (tmp_path / "latch.json").exists()  # read only: the running agent's file stays


class _Node:
    def gpus(self) -> list[GpuInfo]:
        return [GpuInfo(0, "GPU-a", "H100"), GpuInfo(1, "GPU-b", "H100")]

    def read_all(self) -> list[GpuReading]:
        return [
            GpuReading(0, "GPU-a", "H100", lost=True, lost_reason="GpuIsLost"),
            GpuReading(1, "GPU-b", "H100", gpu_util=10, recovery_action=0),
        ]

    def close(self) -> None:
        pass


def test_a_gpu_failed_now_fails_the_check_with_the_rule_that_says_so(tmp_path: Path) -> None:
    found = latched(tmp_path) + probed(_Node())
    assert found == [Finding("GPU-a", "probe", ["gpu_lost"])]
    assert reason(found) == "gpumeter-healthcheck: GPU GPU-a failed (probe: gpu_lost)"


def test_a_nodes_state_and_reason_are_read_from_scontrols_show_node() -> None:
    shown = (
        "NodeName=n1 Arch=x86_64 CoresPerSocket=1\n"
        "   State=IDLE+DRAIN ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A\n"
        "   Partitions=gpu\n"
        "   Reason=fan swap; back Monday [ops@2026-12-07T18:18:03]\n"
    )
    assert NodeStatus.parse(shown) == NodeStatus(
        frozenset({"IDLE", "DRAIN"}), "fan swap; back Monday"
    )
    assert NodeStatus.parse(shown).drained
    assert not NodeStatus.parse("   State=MIXED ThreadsPerCore=1\n").drained
