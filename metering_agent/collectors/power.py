"""Power draw (the total-energy counter, which makes energy exact, is read in ``counters``)."""

from metering_agent.collectors.base import Sample, query


def collect(s: Sample) -> None:
    s.reading.power_mw = query(s, "power_mw", s.nv.nvmlDeviceGetPowerUsage, s.handle)
