"""The driver's recommended recovery action (R550+): reset / reboot / drain means unusable."""

from types import ModuleType
from typing import Any

from metering_agent.collectors.base import as_int, field_values
from metering_agent.nvml.provider import GpuReading


def collect(nv: ModuleType, handle: Any, r: GpuReading) -> None:
    fields = field_values(
        nv, handle, r, {"recovery_action": nv.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION}
    )
    r.recovery_action = as_int(fields["recovery_action"])
