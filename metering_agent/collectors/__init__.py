"""One collector per signal; each fills its part of a ``GpuReading`` from NVML.

A collector is ``collect(sample)`` (see ``base``). ``FAST`` run every second, ``SLOW`` every
``SLOW_INTERVAL_S`` (their values are carried into the readings in between): process listing
takes the driver's lock, and remap flags, link states, NVLink replay / recovery counts and
MIG mode change rarely.
"""

from collections.abc import Callable

from metering_agent.collectors import (
    counters,
    health,
    memory,
    mig,
    power,
    processes,
    thermal,
    utilization,
)
from metering_agent.collectors.base import Sample

Collector = Callable[[Sample], None]

SLOW_INTERVAL_S = 15.0

FAST: tuple[Collector, ...] = (
    utilization.collect,
    memory.collect,
    power.collect,
    thermal.collect,
    counters.collect,
)
SLOW: tuple[Collector, ...] = (health.collect, processes.collect, mig.collect)
# What the slow collectors fill, carried into every reading until they run again.
SLOW_ATTRS = (*health.ATTRS, "process_count", "mig_enabled")
