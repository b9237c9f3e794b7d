"""Temperature, SM clock and the clock-event (throttle) reasons behind slowdowns.

``nvmlDeviceGetTemperatureV`` is missing from nvidia-ml-py 12.560.30 and from older drivers:
``nvmlDeviceGetTemperature`` (deprecated, same reading) stands in.
"""

from metering_agent.collectors.base import Sample, Variant, query, query_variants


def collect(s: Sample) -> None:
    nv, r = s.nv, s.reading
    sensor = (nv.NVML_TEMPERATURE_GPU,)
    r.temp_c = query_variants(
        s,
        "temp_c",
        [Variant("nvmlDeviceGetTemperatureV", sensor), Variant("nvmlDeviceGetTemperature", sensor)],
    )
    r.sm_clock_mhz = query(s, "sm_clock_mhz", nv.nvmlDeviceGetClockInfo, s.handle, nv.NVML_CLOCK_SM)
    r.clock_event_reasons = query(
        s, "clock_event_reasons", nv.nvmlDeviceGetCurrentClocksEventReasons, s.handle
    )
