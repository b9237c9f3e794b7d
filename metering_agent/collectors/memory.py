"""Frame-buffer memory used and total: ``nvmlMemory_v2`` (used excludes driver-reserved memory),
``nvmlDeviceGetMemoryInfo`` v1 on drivers without ``nvmlDeviceGetMemoryInfo_v2``."""

from metering_agent.collectors.base import Sample, Variant, query_variants

MIB = 1024 * 1024


def collect(s: Sample) -> None:
    variants = [
        Variant("nvmlDeviceGetMemoryInfo", kwargs={"version": s.nv.nvmlMemory_v2}),
        Variant("nvmlDeviceGetMemoryInfo"),
    ]
    info = query_variants(s, "memory", variants)
    if info is not None:
        s.reading.mem_used_mib, s.reading.mem_total_mib = (
            int(info.used) // MIB,
            int(info.total) // MIB,
        )
