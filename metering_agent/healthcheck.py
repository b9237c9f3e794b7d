"""``gpumeter-agent --health-check``: is this node fit to run GPU jobs? Slurm's
``HealthCheckProgram`` runs it (through a two-line wrapper: slurm.conf takes no arguments).

A node is unfit while any GPU is failed, by either of:

- the agent's latch (``latch.json`` in its spool directory): a hardware failure the running
  agent saw holds until the GPU is seen repaired (a reset, a reboot, ``--clear-latch``); a latch
  written before the last reboot holds nothing (the reboot was the repair);
- one fresh reading of every GPU (NVML, or the simulator with ``--simulate``), classified by
  the agent's own rules: what fails now (a GPU fallen off the bus, a pending retirement, ...);
- with ``--dcgm-diag``, DCGM's quick diagnostic (``dcgmi diag -r 1 -j``) where ``dcgmi`` is
  installed: each test whose result is ``Fail``. A diagnostic that cannot run (no host engine)
  is reported, not held against the node: the check says what it could not ask.

With ``--drain`` the node (``$SLURMD_NODENAME``, else ``--node-name``) is drained when unfit,
its reason starting ``gpumeter-healthcheck:``, and resumed when fit again, but only if that
reason is still this check's: a node drained by gpumeter's failover comes back through the
reboot gpumeter asks for, and one an operator drained stays drained until the operator says.
Exit status: 0 fit, 1 unfit (a Slurm node whose check fails stays out of service).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from metering_agent.classifier import HealthMemory, classify
from metering_agent.latch import LatchStore
from metering_agent.nvml.provider import GpuProvider
from metering_agent.protocol import GpuState

REASON_PREFIX = "gpumeter-healthcheck:"
SCONTROL_TIMEOUT_S = 10.0
REASON_LENGTH = 200  # what sinfo -R shows in full
_STATE = re.compile(r"^\s*State=(\S+)", re.MULTILINE)
_REASON = re.compile(r"^\s*Reason=(.*?)(?: \[[^\]]*\])?\s*$", re.MULTILINE)


@dataclass(frozen=True)
class Finding:
    gpu_uuid: str | None  # None: the node (DCGM's diagnostic)
    source: str  # "latch", "probe" or "dcgm"
    rules: list[str]

    def text(self) -> str:
        what = "the node" if self.gpu_uuid is None else f"GPU {self.gpu_uuid}"
        return f"{what} failed ({self.source}: {', '.join(self.rules)})"


def latched(spool_dir: Path) -> list[Finding]:
    return [Finding(uuid, "latch", rules) for uuid, rules in LatchStore(spool_dir).failed().items()]


def probed(provider: GpuProvider) -> list[Finding]:
    """Each GPU's reading now, classified as the agent would at its first second."""
    now = int(time.time())
    findings = []
    for reading in provider.read_all():
        verdict, _ = classify(reading, HealthMemory(), now)
        if verdict.state == GpuState.FAILED:
            rules = [ev.rule for ev in verdict.evidence if ev.state == GpuState.FAILED]
            findings.append(Finding(reading.uuid, "probe", rules))
    return findings


DCGM_TIMEOUT_S = 120.0  # -r 1 takes seconds; a hung host engine must not hang slurmd's check


def dcgm_diagnosed() -> tuple[list[Finding], str]:
    """The tests ``dcgmi diag -r 1`` failed (as one finding for the node), and what it did."""
    dcgmi = shutil.which("dcgmi")
    if dcgmi is None:
        return [], "not installed"
    try:
        done = subprocess.run(
            [dcgmi, "diag", "-r", "1", "-j"], capture_output=True, text=True,
            timeout=DCGM_TIMEOUT_S,
        )  # fmt: skip
        failed = sorted(set(_failed_tests(json.loads(done.stdout))))
    except (subprocess.TimeoutExpired, ValueError, OSError) as exc:
        return [], f"could not run: {str(exc)[:100]}"
    if failed:
        return [Finding(None, "dcgm", failed)], f"failed: {', '.join(failed)}"
    return [], "passed" if done.returncode == 0 else f"exit {done.returncode}, no test failed"


def _failed_tests(result: object, name: str = "") -> Iterator[str]:
    """Each test named in dcgmi's JSON whose result says Fail (its layout differs between DCGM
    versions: test categories and tests of per-GPU results; read by key, not by position)."""
    if isinstance(result, dict):
        name = str(result.get("name") or result.get("test_name") or name)
        for key in ("status", "result"):
            if str(result.get(key, "")).lower() == "fail":
                yield name or "diagnostic"
        for value in result.values():
            yield from _failed_tests(value, name)
    elif isinstance(result, list):
        for item in result:
            yield from _failed_tests(item, name)


def reason(findings: Iterable[Finding]) -> str:
    return f"{REASON_PREFIX} {'; '.join(f.text() for f in findings)}"[:REASON_LENGTH]


def node_name(default: str) -> str:
    """The Slurm node this check runs for: slurmd names it (``slurmd -N`` nodes share a host)."""
    return os.environ.get("SLURMD_NODENAME") or default


@dataclass(frozen=True)
class NodeStatus:
    """A Slurm node as ``scontrol show node`` (not --oneliner: one field group a line) shows
    it: its state flags (``IDLE``, ``DRAIN``, ``REBOOT_REQUESTED``, ...) and drain reason."""

    flags: frozenset[str]
    reason: str

    @classmethod
    def parse(cls, shown: str) -> NodeStatus:
        state = m.group(1) if (m := _STATE.search(shown)) else ""
        reason = m.group(1).strip() if (m := _REASON.search(shown)) else ""
        return cls(frozenset(state.split("+")) - {""}, reason)

    @property
    def drained(self) -> bool:
        return "DRAIN" in self.flags


def apply_to_slurm(node: str, findings: list[Finding]) -> str:
    """Drain the unfit node, or resume the fit one this check drained; what was done."""
    status = NodeStatus.parse(_scontrol("show", "node", node))
    drained, current = status.drained, status.reason
    if findings:
        if drained and not current.startswith(REASON_PREFIX):
            return f"left drained ({current or 'no reason'})"  # someone else's drain stands
        if drained and current == reason(findings):
            return "drained already"  # its reason keeps the time it was first drained
        _scontrol("update", f"NodeName={node}", "State=DRAIN", f"Reason={reason(findings)}")
        return "drained"
    if drained and current.startswith(REASON_PREFIX):
        _scontrol("update", f"NodeName={node}", "State=RESUME")
        return "resumed"
    return "unchanged"


def _scontrol(*args: str) -> str:
    done = subprocess.run(
        ["scontrol", *args], capture_output=True, text=True, timeout=SCONTROL_TIMEOUT_S
    )
    if done.returncode != 0:
        raise RuntimeError(f"scontrol {' '.join(args[:2])}: {(done.stderr or done.stdout).strip()}")
    return done.stdout


def run(
    spool_dir: Path, provider: GpuProvider, *, drain: bool, node: str, dcgm: bool = False
) -> int:
    """Print what was found (JSON) and, with ``drain``, what was done in Slurm; 1 when unfit."""
    findings = latched(spool_dir) + probed(provider)
    report: dict[str, object] = {"node": node}
    if dcgm:
        diagnosed, report["dcgm"] = dcgm_diagnosed()
        findings += diagnosed
    report |= {"fit": not findings, "failed": [f.text() for f in findings]}
    if drain:
        report["slurm"] = apply_to_slurm(node, findings)
    print(json.dumps(report))
    return 1 if findings else 0
