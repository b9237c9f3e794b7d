"""Power draw and the total-energy counter (the counter makes energy exact between samples)."""

from types import ModuleType
from typing import Any

from metering_agent.collectors.base import query
from metering_agent.nvml.provider import GpuReading


def collect(nv: ModuleType, handle: Any, r: GpuReading) -> None:
    r.power_mw = query(nv, r, "power_mw", nv.nvmlDeviceGetPowerUsage, handle)
    r.energy_mj = query(nv, r, "energy_mj", nv.nvmlDeviceGetTotalEnergyConsumption, handle)
