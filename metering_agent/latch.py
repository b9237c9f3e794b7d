"""Latched health findings kept in the spool directory, so a restarted agent keeps them.

A hardware failure holds until the GPU is seen repaired (``classifier``), not until the agent
restarts: ``latch.json`` holds, per GPU with a latched finding, its state, the latched evidence
and the repair-signal readings last seen (``classifier.REPAIR_SIGNALS``), with the node's boot id.
At start:

- a different boot id means the node rebooted since: every latch is dropped (the reboot is the
  repair), and each GPU's first reading reports it (``repaired: node_rebooted``);
- otherwise each GPU's memory is restored, so its first reading is compared with the readings
  from before the restart: a reset done while the agent was down shows as a repair signal going
  down, anything else keeps the GPU as it was (no new state change is reported for it).

Written whole or not at all (``spool.write_atomic``): on a latch change at once, and while any
latch is held at most every ``SAVE_EVERY_S`` (the readings move every second). A file that cannot
be read is moved aside, logged, and the agent starts without latches (a failed GPU shows healthy
until its next error: reported, never silent).

A repair the agent cannot see (a GPU reset with persistence mode on that moves none of the
signals, a board swapped for one with the same UUID is not possible) is told to it by the
operator: ``gpumeter-agent --clear-latch UUID --spool-dir DIR`` with the agent stopped; the next
start reports the GPU repaired (``repaired: operator_cleared``).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from metering_agent.classifier import LATCHED, Evidence, HealthMemory
from metering_agent.logs import Log
from metering_agent.protocol import GpuState
from metering_agent.spool import write_atomic

BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")
SAVE_EVERY_S = 5.0
log = Log("metering_agent.latch")


def read_boot_id(path: Path = BOOT_ID_PATH) -> str | None:
    """The kernel's id of this boot: it changes with every reboot (None where there is none)."""
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


class LatchStore:
    def __init__(
        self,
        root: str | Path,
        *,
        boot_id: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = Path(root) / "latch.json"
        self.boot_id = boot_id if boot_id is not None else read_boot_id()
        self._clock = clock
        self._saved: dict[str, Any] | None = None  # what the file holds
        self._saved_at = 0.0

    def load(self) -> dict[str, HealthMemory]:
        """Each GPU's memory as the last run left it; repaired after a reboot."""
        try:
            data = json.loads(self.path.read_bytes())
            gpus = data["gpus"]
            memories = {uuid: _memory(entry) for uuid, entry in gpus.items()}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            aside = self.path.with_name(f"latch.json.unreadable-{int(time.time())}")
            os.replace(self.path, aside)
            log.error("latch_unreadable", error=repr(e), moved_to=str(aside))
            return {}
        if data.get("boot_id") != self.boot_id:
            log.info("latches_cleared", reason="node rebooted", gpus=sorted(memories))
            # Each GPU's first reading reports the repair (a state change with its reason).
            return {
                uuid: HealthMemory(memory.state, repaired="node_rebooted")
                for uuid, memory in memories.items()
            }
        self._saved = data
        for uuid, memory in memories.items():
            log.info("latch_restored", gpu_uuid=uuid, state=memory.state, rules=sorted(memory.held))
        return memories

    def failed(self) -> dict[str, list[str]]:
        """The GPUs a failure is latched on, with its rules, as the file says now (read only:
        the health check reads it beside the running agent); none when it was written before
        the last reboot (the reboot was the repair) or cannot be read (the agent moves it
        aside and logs it)."""
        try:
            data = json.loads(self.path.read_bytes())
            if data.get("boot_id") != self.boot_id:
                return {}
            held = {uuid: entry["held"] for uuid, entry in data["gpus"].items()}
            return {
                uuid: rules
                for uuid, items in held.items()
                if (rules := [str(i["rule"]) for i in items if i["state"] == GpuState.FAILED])
            }
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return {}

    def clear(self, uuids: list[str]) -> list[str]:
        """Mark these GPUs (or ``all``) repaired by the operator, the agent being stopped;
        returns those that were latched."""
        try:
            data = json.loads(self.path.read_bytes())
        except FileNotFoundError:
            return []
        latched = [uuid for uuid, entry in data["gpus"].items() if entry["held"]]
        targets = latched if "all" in uuids else [uuid for uuid in uuids if uuid in latched]
        for uuid in targets:
            data["gpus"][uuid].update(held=[], repaired="operator_cleared")
            log.info("latch_cleared", gpu_uuid=uuid, by="operator")
        write_atomic(self.path, json.dumps(data).encode())
        return targets

    def update(self, memories: Mapping[str, HealthMemory]) -> None:
        """Persist the latched findings when they changed, or their readings when due."""
        gpus = {uuid: _entry(m) for uuid, m in memories.items() if m.latched()}
        data = {"boot_id": self.boot_id, "gpus": gpus}
        if data == self._saved:
            return
        changed = self._saved is None or _latches(data) != _latches(self._saved)
        if not changed and self._clock() - self._saved_at < SAVE_EVERY_S:
            return
        if not gpus and self._saved is None:
            return  # nothing latched, nothing on disk
        write_atomic(self.path, json.dumps(data).encode())
        self._saved, self._saved_at = data, self._clock()


def _latches(data: dict[str, Any]) -> dict[str, Any]:
    return {uuid: entry["held"] for uuid, entry in data["gpus"].items()}


def _entry(memory: HealthMemory) -> dict[str, Any]:
    return {
        "state": memory.state.value,
        "held": [_evidence_json(ev) for ev in memory.latched().values()],
        "counters": memory.counters,
    }


def _evidence_json(ev: Evidence) -> dict[str, Any]:
    return {
        "rule": ev.rule,
        "state": ev.state.value,
        "cause": ev.cause,
        "code": ev.code,
        "detail": ev.detail,
    }


def _memory(entry: dict[str, Any]) -> HealthMemory:
    held: dict[str, tuple[Evidence, int | None]] = {}
    for item in entry["held"]:
        ev = Evidence(
            str(item["rule"]), GpuState(item["state"]), str(item["cause"]), item["code"],
            dict(item["detail"]),
        )  # fmt: skip
        held[ev.rule] = (ev, LATCHED)
    counters = {str(k): int(v) for k, v in entry["counters"].items()}
    repaired = entry.get("repaired")
    return HealthMemory(GpuState(entry["state"]), counters, held, repaired=repaired)
