"""Fault scripts for the simulated GPUs.

A fault script is a JSON list (YAML too, when PyYAML is installed) of steps::

    [
      {"at": 5,  "gpu": 0, "fault": "xid", "xid": 79},
      {"at": 5,  "gpu": 1, "fault": "dbe", "count": 2},
      {"at": 8,  "gpu": 2, "fault": "thermal_slowdown", "duration": 10},
      {"at": 9,  "gpu": 3, "fault": "nvlink_down", "count": 1},
      {"at": 20, "gpu": 0, "fault": "recover"}
    ]

``at`` is seconds since the agent started (float), ``gpu`` the simulated GPU's index.
Faults and their optional parameters:

- ``xid`` (``xid``: code, required): the driver reports that XID. 79 also makes the GPU lost
  (fallen off the bus) and 48 also bumps the volatile uncorrected ECC count, as on hardware.
- ``dbe`` (``count``, default 1): uncontained volatile uncorrectable ECC errors (the driver's
  recovery action becomes "GPU reset"); ``xid`` 94 is the contained kind (row remap pending).
- ``ecc_corrected`` (``count``, default 1000): correctable ECC errors.
- ``nvlink_down`` (``count``: links, default 1); ``nvlink_crc`` (``count``, default 1000).
- ``pcie_replay`` (``count``, default 100): PCIe replays.
- ``thermal_slowdown`` / ``power_brake`` (``duration`` seconds, default 5): clock-event reasons.
- ``retired_pages_pending``, ``row_remap_pending``, ``row_remap_failure``, ``gpu_lost``.
- ``recovery_action`` (``action``: NVML recovery action number, default 1 = GPU reset).
- ``recover``: a GPU reset: every fault cleared, volatile counters back to zero.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_COUNTS = {
    "dbe": 1,
    "ecc_corrected": 1000,
    "nvlink_down": 1,
    "nvlink_crc": 1000,
    "pcie_replay": 100,
}
FLAG_FAULTS = {
    "retired_pages_pending",
    "row_remap_pending",
    "row_remap_failure",
    "gpu_lost",
    "recover",
}
TIMED_FAULTS = {"thermal_slowdown", "power_brake"}
FAULT_KINDS = {"xid", "recovery_action", *DEFAULT_COUNTS, *FLAG_FAULTS, *TIMED_FAULTS}


class FaultScriptError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Fault:
    at: float
    gpu: int
    fault: str
    xid: int | None = None
    count: int = 1
    duration: float = 5.0
    action: int = 1


def parse_faults(steps: Any) -> list[Fault]:
    if not isinstance(steps, list):
        raise FaultScriptError("a fault script is a list of steps")
    faults = [_parse_step(i, step) for i, step in enumerate(steps)]
    return sorted(faults, key=lambda f: f.at)


def _parse_step(i: int, step: Any) -> Fault:
    if not isinstance(step, dict):
        raise FaultScriptError(f"step {i}: expected an object, got {step!r}")
    kind = step.get("fault")
    if kind not in FAULT_KINDS:
        raise FaultScriptError(f"step {i}: unknown fault {kind!r}; one of {sorted(FAULT_KINDS)}")
    if kind == "xid" and not isinstance(step.get("xid"), int):
        raise FaultScriptError(f"step {i}: an xid fault needs an integer 'xid'")
    try:
        return Fault(
            at=float(step["at"]),
            gpu=int(step["gpu"]),
            fault=kind,
            xid=step.get("xid"),
            count=int(step.get("count", DEFAULT_COUNTS.get(kind, 1))),
            duration=float(step.get("duration", 5.0)),
            action=int(step.get("action", 1)),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise FaultScriptError(f"step {i}: {e!r} in {step!r}") from e


def load_faults(path: str | Path) -> list[Fault]:
    text = Path(path).read_text()
    if str(path).endswith((".yaml", ".yml")):
        import yaml  # optional: only needed for YAML scripts

        return parse_faults(yaml.safe_load(text))
    return parse_faults(json.loads(text))
