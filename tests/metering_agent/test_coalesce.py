"""The sampling loop spools one-second records; the uploader sends each run of them as one
record (``spool.coalesce``), and that record is the one a builder never cut would have made."""

from __future__ import annotations

import random
from dataclasses import asdict

from metering_agent.nvml.provider import GpuReading
from metering_agent.protocol import GpuState, UsageRecord
from metering_agent.records import RecordBuilder
from metering_agent.spool import coalesce
from tests.metering_agent.agent_helpers import T0

H, F = GpuState.HEALTHY, GpuState.FAILED


def readings(seconds: int, rng: random.Random) -> list[GpuReading]:
    energy = 5_000_000
    out = []
    for _ in range(seconds):
        energy += rng.randint(250_000, 700_000)  # mJ: a busy GPU's 250-700 W
        out.append(
            GpuReading(
                0, "GPU-a", "H100", gpu_util=rng.randint(0, 100), mem_util=rng.randint(0, 60),
                mem_used_mib=rng.randint(1_000, 80_000), mem_total_mib=81_559,
                power_mw=rng.randint(80_000, 700_000), energy_mj=energy, temp_c=rng.randint(30, 85),
                sm_clock_mhz=rng.randint(1_000, 1_980),
            )
        )  # fmt: skip
    return out


def build(states: list[GpuState], seconds: list[GpuReading], *, every_second: bool) -> list[dict]:
    builder = RecordBuilder("GPU-a", "H100", device_index=0)
    out: list[UsageRecord] = []
    for i, (state, r) in enumerate(zip(states, seconds, strict=True)):
        out += builder.add(T0 + i, r, state)
        if every_second:
            out += builder.close()
    return [asdict(r) for r in out + builder.close()]


def test_one_second_records_coalesce_into_the_uncut_records() -> None:
    rng = random.Random(5)
    states = [H] * 50 + [F] * 30 + [H] * 40  # two state changes and a minute boundary
    seconds = readings(len(states), rng)
    uncut = build(states, seconds, every_second=False)
    cut = build(states, seconds, every_second=True)
    assert len(cut) == len(states)
    joined = coalesce(cut)
    assert [(r["start"], r["end"], r["state"]) for r in joined] == [
        (r["start"], r["end"], r["state"]) for r in uncut
    ]
    # Every reading the service stores is the uncut record's; the SM clock mean (not stored)
    # is the floor of a floor, within a MHz.
    for a, b in zip(joined, uncut, strict=True):
        assert abs(a.pop("sm_clock_mean_mhz") - b.pop("sm_clock_mean_mhz")) <= 1
        assert a == b


def test_records_that_do_not_join_stay_apart() -> None:
    base = {
        "gpu_uuid": "GPU-a", "model": "H100", "state": "healthy", "sample_count": 1,
        "gpu_util_mean": 50.0, "gpu_util_max": 50, "device_index": 0,
    }  # fmt: skip
    first = {**base, "start": T0, "end": T0 + 1}
    apart = [
        {**base, "start": T0 + 2, "end": T0 + 3},  # a missing second
        {**base, "start": T0 + 1, "end": T0 + 2, "state": "failed"},  # another state
        {**base, "start": T0 + 1, "end": T0 + 2, "gpu_util_mean": None},  # a reading left out
        {**base, "start": T0 + 1, "end": T0 + 2, "device_index": 1},  # another device
        {**base, "start": T0 + 1, "end": T0 + 2, "gpu_uuid": "GPU-b"},  # another GPU
    ]
    for other in apart:
        assert coalesce([first, other]) == [first, other]
    minute = T0 - T0 % 60 + 60  # the next minute begins
    edge = [
        {**base, "start": minute - 1, "end": minute},
        {**base, "start": minute, "end": minute + 1},
    ]
    assert coalesce(edge) == edge
