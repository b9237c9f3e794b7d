"""PCIe replay counter: a fast-rising count means a bad link or riser."""

from types import ModuleType
from typing import Any

from metering_agent.collectors.base import as_int, field_values
from metering_agent.nvml.provider import GpuReading


def collect(nv: ModuleType, handle: Any, r: GpuReading) -> None:
    fields = field_values(nv, handle, r, {"pcie_replays": nv.NVML_FI_DEV_PCIE_REPLAY_COUNTER})
    r.pcie_replays = as_int(fields["pcie_replays"])
