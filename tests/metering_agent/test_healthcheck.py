"""``gpumeter-agent --health-check``'s findings: the agent's latched failures (gone once the node
rebooted) and one reading now classified by the agent's rules. Draining and resuming a real
Slurm node: tests/e2e/test_slurm.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from metering_agent.classifier import LATCHED, Evidence, HealthMemory
from metering_agent.healthcheck import (
    Finding,
    NodeStatus,
    dcgm_diagnosed,
    latched,
    probed,
    reason,
)
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


_DIAG = {
    "DCGM GPU Diagnostic": {
        "test_categories": [
            {
                "category": "Deployment",
                "tests": [
                    {"name": "Denylist", "results": [{"status": "Pass"}]},
                    {"name": "NVML Library", "results": [{"status": "Pass"}]},
                ],
            },
            {
                "category": "Hardware",
                "tests": [
                    {"name": "GPU Memory", "results": [{"gpu_ids": "0", "status": "Pass"},
                                                      {"gpu_ids": "1", "status": "Fail"}]},
                ],
            },
        ]
    }
}  # fmt: skip


def _dcgmi(bin_dir: Path, stdout: str, status: int) -> None:
    """A stand-in ``dcgmi`` on PATH that prints ``stdout`` and exits ``status``."""
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "dcgmi"
    script.write_text(f"#!/bin/sh\ncat <<'EOF'\n{stdout}\nEOF\nexit {status}\n")
    script.chmod(0o755)


def test_dcgms_quick_diagnostic_fails_the_node_by_the_tests_it_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    assert dcgm_diagnosed() == ([], "not installed")
    _dcgmi(tmp_path / "bin", json.dumps(_DIAG), 226)
    assert dcgm_diagnosed() == (
        [Finding(None, "dcgm", ["GPU Memory"])],
        "failed: GPU Memory",
    )
    assert reason(dcgm_diagnosed()[0]) == "gpumeter-healthcheck: the node failed (dcgm: GPU Memory)"
    passed = json.dumps(_DIAG).replace('"Fail"', '"Pass"')
    _dcgmi(tmp_path / "bin", passed, 0)
    assert dcgm_diagnosed() == ([], "passed")
    # No host engine: the diagnostic could not ask, which is no finding against the node.
    _dcgmi(tmp_path / "bin", "Error: unable to establish a connection to the host engine", 1)
    findings, said = dcgm_diagnosed()
    assert findings == [] and said.startswith("could not run")
