"""Simulated GPUs with plausible, varying readings and a fault script (see ``faults``).

Stands in for NVML in tests, the demo and benchmarks. UUIDs are derived from the node name, an
optional prefix and the index, so a restarted agent reports the same GPUs.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from metering_agent.faults import Fault
from metering_agent.nvml.provider import (
    CLOCKS_EVENT_HW_POWER_BRAKE,
    CLOCKS_EVENT_HW_SLOWDOWN,
    CLOCKS_EVENT_HW_THERMAL,
    GpuInfo,
    GpuReading,
)

SIM_NAMESPACE = uuid.UUID("5c1a6f1e-4b7e-4f0e-9a53-0d3f6a1b2c4d")


@dataclass(frozen=True, slots=True)
class Model:
    name: str
    mem_total_mib: int
    idle_w: float
    max_w: float
    sm_clock_mhz: int
    nvlinks: int  # 0: a PCIe card, NVLink fields unsupported


MODELS = {
    m.name: m
    for m in (
        Model("NVIDIA H100 80GB HBM3", 81559, 70, 700, 1980, 18),
        Model("NVIDIA H200", 143771, 75, 700, 1980, 18),
        Model("NVIDIA A100-SXM4-80GB", 81920, 55, 400, 1410, 12),
        Model("NVIDIA L40S", 46068, 35, 350, 2520, 0),
    )
}
DEFAULT_MODEL = "NVIDIA H100 80GB HBM3"


def model_for(name: str) -> Model:
    """Accept NVML names with or without the "NVIDIA " prefix."""
    model = MODELS.get(name) or MODELS.get(f"NVIDIA {name}")
    if model is None:
        raise ValueError(f"unknown GPU model {name!r}; known: {sorted(MODELS)}")
    return model


def sim_uuid(node: str, index: int, prefix: str = "") -> str:
    return f"GPU-{uuid.uuid5(SIM_NAMESPACE, f'{prefix}:{node}:{index}')}"


class SimulatedGpu:
    def __init__(self, info: GpuInfo, model: Model, rng: random.Random) -> None:
        self.info, self.model, self._rng = info, model, rng
        self._util = rng.uniform(0, 100)
        # As a GPU's counter, it never goes down while the "driver" stays loaded, agent restarts
        # included (it would read as a reset): it starts at max power times the wall clock, and
        # nothing random (an unseeded restart would start lower).
        self._energy_mj = int(time.time() * model.max_w * 1000)
        self._reset()

    def _reset(self) -> None:
        self.lost = False
        self.recovered = False
        self.ecc_corrected = self.ecc_uncorrected = 0
        self.retired_pending = self.remap_pending = self.remap_failure = False
        self.links_down = 0
        self.nvlink_crc = 0
        self.pcie_replays = 0
        self.recovery_action = 0
        self.slowdown: dict[int, float] = {}  # clock-event bit -> until (seconds since start)
        self.xids: list[int] = []

    def apply(self, f: Fault, t: float) -> None:
        match f.fault:
            case "xid":
                assert f.xid is not None
                self.xids.append(f.xid)
                self.lost = self.lost or f.xid == 79
                self.ecc_uncorrected += f.xid in (48, 94)
                self.remap_pending = self.remap_pending or f.xid == 94  # contained: remap at reset
            case "dbe":
                # Uncontained (as XID 95 reports it): the driver asks for a GPU reset.
                self.ecc_uncorrected += f.count
                self.recovery_action = 1
            case "ecc_corrected":
                self.ecc_corrected += f.count
            case "nvlink_down":
                self.links_down = min(self.model.nvlinks, self.links_down + f.count)
            case "nvlink_crc":
                self.nvlink_crc += f.count
            case "pcie_replay":
                self.pcie_replays += f.count
            case "thermal_slowdown":
                self.slowdown[CLOCKS_EVENT_HW_THERMAL] = t + f.duration
            case "power_brake":
                self.slowdown[CLOCKS_EVENT_HW_POWER_BRAKE] = t + f.duration
            case "retired_pages_pending":
                self.retired_pending = True
            case "row_remap_pending":
                self.remap_pending = True
            case "row_remap_failure":
                self.remap_failure = True
            case "gpu_lost":
                self.lost = True
            case "recovery_action":
                self.recovery_action = f.action
            case "recover":
                self._reset()
                self.recovered = True

    def read(self, t: float, dt: float) -> GpuReading:
        info, m = self.info, self.model
        r = GpuReading(info.index, info.uuid, info.name, info.minor, recovered=self.recovered)
        self.recovered = False
        r.xids, self.xids = self.xids, []
        if self.lost:
            r.lost, r.lost_reason = True, "GPU is lost"
            return r
        self._util = min(100.0, max(0.0, self._util + self._rng.gauss(0, 8)))
        reasons = sum(bit for bit, until in self.slowdown.items() if until > t)
        throttled = bool(reasons)
        if throttled:
            reasons |= CLOCKS_EVENT_HW_SLOWDOWN
        power_w = m.idle_w + (m.max_w - m.idle_w) * self._util / 100 * (0.6 if throttled else 1)
        self._energy_mj += int(power_w * dt * 1000)
        r.gpu_util = round(self._util)
        r.mem_util = round(self._util * 0.6)
        r.mem_total_mib = m.mem_total_mib
        r.mem_used_mib = int(m.mem_total_mib * min(1.0, 0.05 + self._util / 110))
        r.power_mw = int(power_w * 1000)
        r.energy_mj = self._energy_mj
        r.temp_c = round(32 + self._util * 0.45 + (25 if throttled else 0))
        r.sm_clock_mhz = int(m.sm_clock_mhz * (0.5 if throttled else 1))
        r.clock_event_reasons = reasons
        r.ecc_corrected_volatile = self.ecc_corrected
        r.ecc_uncorrected_volatile = self.ecc_uncorrected
        r.retired_pages_pending = self.retired_pending
        r.remap_pending, r.remap_failure = self.remap_pending, self.remap_failure
        if m.nvlinks:
            r.nvlink_links, r.nvlink_links_down = m.nvlinks, self.links_down
            r.nvlink_crc_errors = self.nvlink_crc
        else:
            r.unsupported["nvlink_links"] = "Not Supported"
        r.pcie_replays = self.pcie_replays
        r.recovery_action = self.recovery_action
        r.process_count = int(self._util > 5)
        return r


class SimulatedProvider:
    def __init__(
        self,
        count: int,
        *,
        models: list[str] | None = None,
        node: str = "sim",
        uuid_prefix: str = "",
        seed: int | None = None,
        faults: list[Fault] | None = None,
        clock: Callable[[], float],
        minors: list[int] | None = None,
    ) -> None:
        """``minors``: each GPU's device minor number, by NVML index (default: the index; a
        node whose device files number its GPUs in another order than NVML gives them)."""
        names = [model_for(n) for n in (models or [DEFAULT_MODEL])]
        rng = random.Random(seed)
        if minors is not None and len(minors) != count:
            raise ValueError(f"{len(minors)} minor numbers for {count} GPUs")
        numbers = list(range(count)) if minors is None else minors
        self._gpus = [
            SimulatedGpu(
                GpuInfo(i, sim_uuid(node, i, uuid_prefix), names[i % len(names)].name, numbers[i]),
                names[i % len(names)],
                random.Random(rng.random()),
            )
            for i in range(count)
        ]
        self._faults = list(faults or [])
        self._clock = clock
        self._start = self._last = clock()

    def gpus(self) -> list[GpuInfo]:
        return [g.info for g in self._gpus]

    def read_all(self) -> list[GpuReading]:
        now = self._clock()
        t, dt = now - self._start, now - self._last
        self._last = now
        while self._faults and self._faults[0].at <= t:
            fault = self._faults.pop(0)
            if 0 <= fault.gpu < len(self._gpus):
                self._gpus[fault.gpu].apply(fault, t)
        return [g.read(t, dt) for g in self._gpus]

    def close(self) -> None:
        pass
