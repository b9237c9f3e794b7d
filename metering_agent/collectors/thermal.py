"""Temperature, SM clock and the clock-event (throttle) reasons behind slowdowns."""

from types import ModuleType
from typing import Any

from metering_agent.collectors.base import query
from metering_agent.nvml.provider import GpuReading


def collect(nv: ModuleType, handle: Any, r: GpuReading) -> None:
    r.temp_c = query(nv, r, "temp_c", nv.nvmlDeviceGetTemperatureV, handle, nv.NVML_TEMPERATURE_GPU)
    r.sm_clock_mhz = query(
        nv, r, "sm_clock_mhz", nv.nvmlDeviceGetClockInfo, handle, nv.NVML_CLOCK_SM
    )
    r.clock_event_reasons = query(
        nv, r, "clock_event_reasons", nv.nvmlDeviceGetCurrentClocksEventReasons, handle
    )
