"""Number of running compute processes (a cheap "is it in use" signal)."""

from types import ModuleType
from typing import Any

from metering_agent.collectors.base import query
from metering_agent.nvml.provider import GpuReading


def collect(nv: ModuleType, handle: Any, r: GpuReading) -> None:
    procs = query(nv, r, "process_count", nv.nvmlDeviceGetComputeRunningProcesses, handle)
    if procs is not None:
        r.process_count = len(procs)
