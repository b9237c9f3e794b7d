"""GPU and memory-controller utilisation over the last sample period."""

from metering_agent.collectors.base import Sample, query


def collect(s: Sample) -> None:
    rates = query(s, "utilization", s.nv.nvmlDeviceGetUtilizationRates, s.handle)
    if rates is not None:
        s.reading.gpu_util, s.reading.mem_util = int(rates.gpu), int(rates.memory)
