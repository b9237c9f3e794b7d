"""Minute metrics of simulated GPU-hours, packed by the metering code itself.

Every row is built by ``packing.add_records`` from per-minute usage records like the agent's.
A steady hour (one state, one workload) is the same bytes whatever GPU reports it, so a few
dozen variants per (model, workload) are built once and reused: a month of a 3,000-GPU fleet
costs a dictionary lookup per GPU-hour, and only hours cut by a state change are packed apart.
"""

from __future__ import annotations

import random
from functools import lru_cache

from app.metering import packing
from app.metering.segments import Span
from metering_agent.nvml.simulated import model_for
from metering_agent.protocol import MINUTE, GpuState, UsageRecord

HOUR = packing.HOUR
VARIANTS = 24  # distinct busy hours per model: enough that charts don't look tiled


def minute_record(
    gpu_uuid: str, model: str, start: int, end: int, state: str, util: float
) -> UsageRecord:
    """A record of ``[start, end)`` (within one minute) at ``util`` % with plausible readings."""
    seconds = end - start
    if state == GpuState.FAILED:  # lost to the driver: sampled, nothing readable
        return UsageRecord(gpu_uuid, model, start, end, GpuState.FAILED, seconds)
    m = model_for(model)
    power = m.idle_w + (m.max_w - m.idle_w) * util / 100
    return UsageRecord(
        gpu_uuid,
        model,
        start,
        end,
        GpuState(state),
        seconds,
        gpu_util_mean=round(util, 2),
        gpu_util_max=min(100, round(util * 1.1)),
        mem_util_mean=round(util * 0.6, 2),
        mem_used_max_mib=round(m.mem_total_mib * (0.05 + 0.85 * util / 100)),
        mem_total_mib=m.mem_total_mib,
        energy_j=round(power * seconds, 3),
        power_max_w=round(power * 1.08, 1),
        temp_max_c=round(34 + util * 0.42),
        sm_clock_mean_mhz=m.sm_clock_mhz if util > 1 else 345,
    )


def _minute_utils(busy: bool, rng: random.Random) -> list[float]:
    if not busy:
        return [0.0] * (HOUR // MINUTE)
    level = rng.uniform(55, 97)
    return [min(100.0, max(0.0, rng.gauss(level, 6))) for _ in range(HOUR // MINUTE)]


@lru_cache(maxsize=4096)
def steady_hour(model: str, state: str, busy: bool, variant: int) -> bytes:
    """A whole hour in one state: busy (a training job's wobble) or idle; failed reads nothing."""
    rng = random.Random(f"{model}|{busy}|{variant}")
    utils = _minute_utils(busy and state != GpuState.FAILED, rng)
    records = [
        minute_record("", model, i * MINUTE, (i + 1) * MINUTE, state, u)
        for i, u in enumerate(utils)
    ]
    return packing.add_records(packing.EMPTY_ROW, records)


def cut_hour(
    gpu_uuid: str, model: str, hour: int, runs: list[Span], busy: bool, rng: random.Random
) -> bytes:
    """An hour that state changes (or the window's edges) cut: packed minute piece by piece."""
    utils = _minute_utils(busy, rng)
    records = []
    for run in runs:
        a, hi = max(run.start, hour), min(run.end, hour + HOUR)
        while a < hi:  # records never cross a minute boundary
            b = min(hi, a - a % MINUTE + MINUTE)
            util = utils[(a - hour) // MINUTE]
            records.append(minute_record(gpu_uuid, model, a, b, run.state, util))
            a = b
    return packing.add_records(packing.EMPTY_ROW, records)
