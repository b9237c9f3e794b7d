"""GPU and memory-controller utilisation over the last sample period."""

from types import ModuleType
from typing import Any

from metering_agent.collectors.base import query
from metering_agent.nvml.provider import GpuReading


def collect(nv: ModuleType, handle: Any, r: GpuReading) -> None:
    rates = query(nv, r, "utilization", nv.nvmlDeviceGetUtilizationRates, handle)
    if rates is not None:
        r.gpu_util, r.mem_util = int(rates.gpu), int(rates.memory)
