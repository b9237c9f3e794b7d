"""Record builder: consecutive seconds in the same state become one usage record.

A record ``[start, end)`` is closed when the state changes, when a UTC minute boundary is
reached, when a second is missing (a skipped second never sits inside a record), or when the
runner cuts it (``close``: every upload round, and at once on a health event). Records for one
GPU never overlap or go backwards: seconds before ``floor`` (the end of the last record already
closed, including those spooled by a previous run) are refused.

Energy is reported in whole decijoules (the service's resolution), each record carrying the
increase of the GPU's rounded running total: however a minute is cut into records, its records'
energies add up to exactly what one uncut record would report (rounding never accumulates).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

from metering_agent.classifier import event_id
from metering_agent.nvml.provider import GpuReading
from metering_agent.protocol import MINUTE, EventKind, GpuState, HealthEvent, UsageRecord


@dataclass(slots=True)
class _Run:
    start: int
    end: int
    state: GpuState
    samples: int = 0
    util_sum: int = 0
    util_n: int = 0
    util_max: int | None = None
    mem_util_sum: int = 0
    mem_util_n: int = 0
    mem_used_max: int | None = None
    mem_total: int | None = None
    energy_j: float | None = None
    power_max_w: float | None = None
    temp_max: int | None = None
    clock_sum: int = 0
    clock_n: int = 0


N = TypeVar("N", int, float)


def _max(a: N | None, b: N) -> N:
    return b if a is None else max(a, b)


class RecordBuilder:
    """Builds the records of one GPU from per-second readings."""

    def __init__(
        self,
        gpu_uuid: str,
        model: str,
        floor: int = 0,
        device_index: int | None = None,
        minor_number: int | None = None,
    ) -> None:
        self.gpu_uuid, self.model, self.device_index = gpu_uuid, model, device_index
        self.minor_number = minor_number
        self.floor = floor  # no record may start before this second
        self._run: _Run | None = None
        self._last_energy: tuple[int, int] | None = None  # (second, counter mJ)
        self._energy_total_j = 0.0  # every second's energy since this builder began
        self._energy_sent_dj = 0  # the total, rounded to decijoules, as far as records carry it

    def add(self, second: int, r: GpuReading, state: GpuState) -> list[UsageRecord]:
        """Account ``second`` to ``state``; return the records this closes."""
        if second < self.floor or (self._run is not None and second < self._run.end):
            return []  # already accounted for: never overlap
        closed: list[UsageRecord] = []
        run = self._run
        if run is not None and (run.state != state or second != run.end or second % MINUTE == 0):
            closed.append(self._close())
            run = None
        if run is None:
            run = self._run = _Run(second, second, state)
        run.end = second + 1
        self._accumulate(run, second, r)
        return closed

    def close(self) -> list[UsageRecord]:
        return [self._close()] if self._run is not None else []

    def _close(self) -> UsageRecord:
        run, self._run = self._run, None
        assert run is not None
        self.floor = run.end
        return UsageRecord(
            gpu_uuid=self.gpu_uuid,
            model=self.model,
            start=run.start,
            end=run.end,
            state=run.state,
            sample_count=run.samples,
            gpu_util_mean=round(run.util_sum / run.util_n, 2) if run.util_n else None,
            gpu_util_max=run.util_max,
            mem_util_mean=round(run.mem_util_sum / run.mem_util_n, 2) if run.mem_util_n else None,
            mem_used_max_mib=run.mem_used_max,
            mem_total_mib=run.mem_total,
            energy_j=None if run.energy_j is None else self._energy_increase_j(),
            power_max_w=run.power_max_w,
            temp_max_c=run.temp_max,
            sm_clock_mean_mhz=run.clock_sum // run.clock_n if run.clock_n else None,
            device_index=self.device_index,
            minor_number=self.minor_number,
        )

    def _energy_increase_j(self) -> float:
        """The rounded running total's increase since the previous record, in joules."""
        total_dj = round(self._energy_total_j * 10)
        increase, self._energy_sent_dj = total_dj - self._energy_sent_dj, total_dj
        return increase / 10

    def _accumulate(self, run: _Run, second: int, r: GpuReading) -> None:
        run.samples += 1
        if r.gpu_util is not None:
            run.util_sum += r.gpu_util
            run.util_n += 1
            run.util_max = _max(run.util_max, r.gpu_util)
        if r.mem_util is not None:
            run.mem_util_sum += r.mem_util
            run.mem_util_n += 1
        if r.mem_used_mib is not None:
            run.mem_used_max = _max(run.mem_used_max, r.mem_used_mib)
        run.mem_total = r.mem_total_mib if r.mem_total_mib is not None else run.mem_total
        power_w = None if r.power_mw is None else r.power_mw / 1000
        if power_w is not None:
            run.power_max_w = _max(run.power_max_w, power_w)
        if r.temp_c is not None:
            run.temp_max = _max(run.temp_max, r.temp_c)
        if r.sm_clock_mhz is not None:
            run.clock_sum += r.sm_clock_mhz
            run.clock_n += 1
        joules = self._energy_j(second, r, power_w)
        if joules is not None:
            run.energy_j = (run.energy_j or 0.0) + joules
            self._energy_total_j += joules

    def _energy_j(self, second: int, r: GpuReading, power_w: float | None) -> float | None:
        """Energy of this second: the counter's increase when contiguous, else power x 1 s."""
        previous, self._last_energy = self._last_energy, None
        if r.energy_mj is not None:
            self._last_energy = (second, r.energy_mj)
            if previous is not None and previous[0] == second - 1 and r.energy_mj >= previous[1]:
                return (r.energy_mj - previous[1]) / 1000
        return power_w


def unmetered_event(gpu_uuid: str, start: int, end: int, reason: str, **detail: Any) -> HealthEvent:
    """The seconds ``[start, end)`` of this GPU went unmetered, and why: the service's timeline
    then explains the gap instead of showing a silent hole."""
    kind = EventKind.UNMETERED
    return HealthEvent(
        event_id(gpu_uuid, start, kind.value, reason, 0),
        gpu_uuid,
        start,
        kind,
        rule=reason,
        detail={"start": start, "end": end, "seconds": end - start, "reason": reason, **detail},
    )
