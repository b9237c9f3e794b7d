"""Number of running compute processes (a cheap "is it in use" signal; a slow signal: listing
processes takes the driver's lock). The binding's unversioned call wraps ``_v3``, which drivers
before R535 lack (it raises ``NVMLLibraryMismatchError``): ``_v2`` stands in."""

from metering_agent.collectors.base import Sample, Variant, query_variants


def collect(s: Sample) -> None:
    variants = [
        Variant("nvmlDeviceGetComputeRunningProcesses"),
        Variant("nvmlDeviceGetComputeRunningProcesses_v2"),
    ]
    procs = query_variants(s, "process_count", variants)
    if procs is not None:
        s.reading.process_count = len(procs)
