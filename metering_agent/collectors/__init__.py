"""One collector per signal; each fills its part of a ``GpuReading`` from NVML.

A collector is ``collect(nvml_module, device_handle, reading)``. It tolerates unsupported calls
(recording them in ``reading.unsupported``) and raises ``GpuLost`` when the device is gone.
"""

from collections.abc import Callable
from types import ModuleType
from typing import Any

from metering_agent.collectors import (
    ecc,
    memory,
    nvlink,
    pcie,
    power,
    processes,
    recovery,
    remap,
    thermal,
    utilization,
)
from metering_agent.nvml.provider import GpuReading

Collector = Callable[[ModuleType, Any, GpuReading], None]

COLLECTORS: tuple[Collector, ...] = (
    utilization.collect,
    memory.collect,
    power.collect,
    thermal.collect,
    ecc.collect,
    remap.collect,
    nvlink.collect,
    pcie.collect,
    recovery.collect,
    processes.collect,
)
