"""Frame-buffer memory used and total."""

from types import ModuleType
from typing import Any

from metering_agent.collectors.base import query
from metering_agent.nvml.provider import GpuReading

MIB = 1024 * 1024


def collect(nv: ModuleType, handle: Any, r: GpuReading) -> None:
    info = query(nv, r, "memory", nv.nvmlDeviceGetMemoryInfo, handle)
    if info is not None:
        r.mem_used_mib, r.mem_total_mib = int(info.used) // MIB, int(info.total) // MIB
