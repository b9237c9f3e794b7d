"""Pure fleet history: when each GPU fails, how long it stays failed, and its state runs.

Failures follow a per-GPU-day probability (0.72 %/GPU/day by default, a large-fleet figure);
each one is a fatal XID that keeps the GPU ``failed`` until it is repaired (reset or swapped)
some hours later. The health events come from the agent's own classifier, so their ids, rules
and evidence are exactly what a node would report.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from app.metering.segments import Span
from metering_agent.classifier import HealthMemory, classify
from metering_agent.nvml.provider import GpuReading
from metering_agent.protocol import GpuState, HealthEvent

DAY = 86_400
# Fatal XIDs and how often each ends a GPU's run (fallen off the bus and DBE dominate).
FATAL_XIDS = {79: 0.35, 48: 0.2, 119: 0.15, 74: 0.1, 95: 0.08, 64: 0.07, 120: 0.05}
REPAIR_MEDIAN_S = 3 * 3600  # drained, reset or swapped, and checked
REPAIR_BOUNDS_S = (20 * 60, DAY)


@dataclass(frozen=True, slots=True)
class SimGpu:
    uuid: str
    model: str  # NVML device name


@dataclass(frozen=True, slots=True)
class Failure:
    gpu_uuid: str
    at: int  # first failed second
    xid: int
    repaired_at: int  # first healthy second again (may lie past the window)


def plan_failures(
    gpus: list[SimGpu], start: int, end: int, rate_per_day: float, rng: random.Random
) -> list[Failure]:
    """Failures of every GPU in ``[start, end)``, in time order; one GPU's never overlap."""
    codes, weights = list(FATAL_XIDS), list(FATAL_XIDS.values())
    failures: list[Failure] = []
    for gpu in gpus:
        free_from = start
        for day in range(start, end, DAY):
            if rng.random() >= rate_per_day:
                continue
            at = rng.randrange(day, min(day + DAY, end))
            if at < free_from:
                continue
            repair = round(rng.lognormvariate(0, 0.8) * REPAIR_MEDIAN_S)
            repair = min(max(repair, REPAIR_BOUNDS_S[0]), REPAIR_BOUNDS_S[1])
            xid = rng.choices(codes, weights)[0]
            failures.append(Failure(gpu.uuid, at, xid, at + repair))
            free_from = at + repair
    return sorted(failures, key=lambda f: (f.at, f.gpu_uuid))


def state_runs(failures: list[Failure], start: int, end: int) -> list[Span]:
    """One GPU's maximal state runs over ``[start, end)`` given its failures (sorted)."""
    runs: list[Span] = []
    cursor = start
    for f in failures:
        if f.at > cursor:
            runs.append(Span(cursor, f.at, GpuState.HEALTHY.value))
        runs.append(Span(f.at, min(f.repaired_at, end), GpuState.FAILED.value))
        cursor = min(f.repaired_at, end)
    if cursor < end:
        runs.append(Span(cursor, end, GpuState.HEALTHY.value))
    return runs


def failure_events(gpu: SimGpu, failure: Failure, end: int) -> list[HealthEvent]:
    """What the agent's classifier reports at the failure and, within the window, the repair."""
    reading = GpuReading(0, gpu.uuid, gpu.model, lost=failure.xid == 79, xids=[failure.xid])
    verdict, memory = classify(reading, HealthMemory(), failure.at)
    events = list(verdict.events)
    if failure.repaired_at < end:
        reset = GpuReading(0, gpu.uuid, gpu.model, recovered=True)
        repaired, _ = classify(reset, memory, failure.repaired_at)
        events += repaired.events
    return events
