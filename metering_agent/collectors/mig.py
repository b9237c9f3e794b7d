"""MIG mode. With MIG on, the GPU is still metered (and billed) as one whole GPU: the readings
are the parent device's, and per-slice metering is not done."""

from metering_agent.collectors.base import Sample, query


def collect(s: Sample) -> None:
    mode = query(s, "mig_mode", s.nv.nvmlDeviceGetMigMode, s.handle)
    if mode is not None:
        s.reading.mig_enabled = int(mode[0]) == s.nv.NVML_DEVICE_MIG_ENABLE
