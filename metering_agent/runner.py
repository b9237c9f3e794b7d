"""The 1 Hz sampling loop: provider -> classifier -> record builder -> spool.

Samples are taken just after each wall-clock second boundary and labelled with that second.
The wall clock is checked against the monotonic clock every tick: when they disagree by more than
``JUMP_TOLERANCE_S`` (NTP step, manual change, VM pause) the jump is logged, reported as a
``clock_jump`` event, the open records are closed and that tick is skipped; seconds already
accounted for are never sampled again, so records never overlap or run backwards.

Seconds that no tick sampled (the process was stopped or the VM paused, a tick stalled, or the
clock jumped forward) are reported per GPU as one ``unmetered`` event with the gap's start, end
and length, so the service's timeline explains the hole. A restarted agent reports the seconds
between a GPU's last spooled record and its first new sample the same way (``agent_stopped``):
what a SIGKILL lost (at most one upload round) plus the time it was down.

Cuts (protocol.py): every tick closes the open records of all GPUs and makes them durable in
the spool's journal (fsync'd), so a SIGKILL loses at most the second being sampled. At the first
tick of every upload round the journal is sealed as a batch and the uploader told to send it at
the round's time; the uploader sends each GPU's one-second records of a minute and state as one
record (``spool.coalesce``), so a longer round costs the service fewer batches, not more
records. A tick that brings any health event (a state change included) seals the same way and
has the uploader send at once: failures are never held back for the round.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol

from metering_agent.classifier import HealthMemory, classify, event_id
from metering_agent.latch import LatchStore
from metering_agent.logs import Log
from metering_agent.metrics import Metrics
from metering_agent.nvml.provider import GpuProvider, GpuReading
from metering_agent.protocol import EventKind, HealthEvent, UsageRecord
from metering_agent.records import RecordBuilder, unmetered_event
from metering_agent.schedule import UploadSchedule
from metering_agent.spool import Spool

JUMP_TOLERANCE_S = 0.5
TICK_OFFSET_S = 0.01  # sample just after the boundary, so int(time) is the new second

log = Log("metering_agent.runner")


class Clock(Protocol):
    def wall(self) -> float: ...

    def mono(self) -> float: ...

    def sleep(self, seconds: float, stop: threading.Event) -> None: ...


class SystemClock:
    def wall(self) -> float:
        return time.time()

    def mono(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float, stop: threading.Event) -> None:
        stop.wait(seconds)


@dataclass(slots=True)
class _Track:
    builder: RecordBuilder
    memory: HealthMemory = field(default_factory=HealthMemory)


def _no_sender(at: float) -> None:
    """No uploader is listening (tests of the sampling loop alone)."""


class Runner:
    def __init__(
        self,
        provider: GpuProvider,
        spool: Spool,
        *,
        clock: Clock,
        metrics: Metrics,
        schedule: UploadSchedule | None = None,
        send_at: Callable[[float], None] = _no_sender,
        latches: LatchStore | None = None,
    ) -> None:
        self.provider, self.spool, self.clock, self.metrics = provider, spool, clock, metrics
        self.schedule = schedule or UploadSchedule(2.0)
        self._send_at = send_at  # the uploader: send what is sealed at this wall-clock time
        self._next_round: float | None = None
        self._tracks: dict[str, _Track] = {}
        self._last_tick: tuple[float, float] | None = None  # (wall, mono)
        self._last_second: int | None = None
        self._jumped = False  # the previous tick saw a clock jump
        # Failures latched until repair survive a restart (latch.py); none without a store.
        self._latches = latches
        self._restored = latches.load() if latches is not None else {}

    def _track(self, r: GpuReading, second: int, events: list[HealthEvent]) -> _Track:
        track = self._tracks.get(r.uuid)
        if track is None:
            # Resume after the last record spooled by any earlier run: never overlap it.
            floor = self.spool.last_ends.get(r.uuid, 0)
            builder = RecordBuilder(r.uuid, r.name, floor, r.index, r.minor)
            memory = self._restored.pop(r.uuid, HealthMemory())
            track = self._tracks[r.uuid] = _Track(builder, memory)
            if 0 < floor < second:
                events.append(_stopped_event(r.uuid, floor, second))
        return track

    def tick(self) -> None:
        wall, mono = self.clock.wall(), self.clock.mono()
        second = int(wall)
        self.metrics.set("gpumeter_agent_sample_lag_seconds", round(wall - second, 4))
        previous, self._last_tick = self._last_tick, (wall, mono)
        if previous is not None:
            skew = (wall - previous[0]) - (mono - previous[1])
            if abs(skew) > JUMP_TOLERANCE_S:
                self._clock_jump(second, skew)
                return
        if self._last_second is not None and second <= self._last_second:
            return  # already sampled (the wall clock went back): skip, don't overlap
        records: list[UsageRecord] = []
        events: list[HealthEvent] = []
        if self._last_second is not None and second > self._last_second + 1:
            since = mono - previous[1] if previous is not None else 0.0
            events += self._gap(self._last_second + 1, second, since)
        self._last_second, self._jumped = second, False
        for r in self.provider.read_all():
            track = self._track(r, second, events)
            verdict, track.memory = classify(r, track.memory, second)
            events.extend(verdict.events)
            records.extend(track.builder.add(second, r, verdict.state))
            self.metrics.update_gpu(r, verdict.state)
            for event in verdict.events:
                log.info("health_event", **_event_fields(event))
                if event.kind == EventKind.XID_UNKNOWN:
                    self.metrics.inc("gpumeter_agent_unknown_xids_total", code=str(event.code))
        self._save_latches()
        round_at = self._round_due(second)
        records += self._close_records()  # every second: a SIGKILL loses this second at most
        if events:
            self._cut(records, events, send_at=wall)
        elif round_at is not None:
            self._cut(records, events, send_at=round_at)
        else:
            self._spool(records, events)

    def _save_latches(self) -> None:
        if self._latches is None:
            return
        try:
            # A GPU restored but not read yet (unreadable at start) keeps its latch.
            memories = {**self._restored, **{u: t.memory for u, t in self._tracks.items()}}
            self._latches.update(memories)
        except OSError as e:  # retried next tick; until then a restart forgets the newest latch
            log.error("latch_save_failed", error=repr(e))

    def _round_due(self, second: int) -> float | None:
        """The upload round that falls within this second (or was missed), if any."""
        if self._next_round is None:
            self._next_round = self.schedule.first_round_from(second)
        if self._next_round >= second + 1:
            return None
        due, self._next_round = self._next_round, self.schedule.first_round_from(second + 1)
        return due

    def _cut(self, records: list[UsageRecord], events: list[HealthEvent], send_at: float) -> None:
        """Close every open record, make all durable as a sealed batch, and have it sent."""
        self.spool.append([*records, *self._close_records()], events)
        self.spool.flush()
        self.spool.seal(force=True)
        self._send_at(send_at)

    def _gap(self, start: int, end: int, elapsed_s: float) -> list[HealthEvent]:
        """Seconds ``[start, end)`` were never sampled: say so, with the likely cause."""
        reason = "clock_jump" if self._jumped else "agent_paused"
        log.warning(
            "sampling_gap", start=start, end=end, seconds=end - start, reason=reason,
            since_last_tick_s=round(elapsed_s, 3),
        )  # fmt: skip
        self.metrics.inc("gpumeter_agent_unsampled_seconds_total", end - start)
        return [unmetered_event(uuid, start, end, reason) for uuid in self._tracks]

    def _clock_jump(self, second: int, skew: float) -> None:
        log.warning("clock_jump", skew_s=round(skew, 3), second=second, action="tick skipped")
        self._jumped = True
        self.metrics.inc("gpumeter_agent_clock_jumps_total")
        events = [
            HealthEvent(
                event_id(uuid, second, EventKind.CLOCK_JUMP.value, None, 0),
                uuid,
                second,
                EventKind.CLOCK_JUMP,
                detail={"skew_s": round(skew, 3)},
            )
            for uuid in self._tracks
        ]
        self._cut([], events, send_at=self.clock.wall())

    def _close_records(self) -> list[UsageRecord]:
        return [rec for track in self._tracks.values() for rec in track.builder.close()]

    def _spool(self, records: list[UsageRecord], events: list[HealthEvent]) -> None:
        self.spool.append(records, events)
        self.spool.flush()
        self.spool.seal()

    def run(self, stop: threading.Event, duration_s: float | None = None) -> None:
        deadline = None if duration_s is None else self.clock.mono() + duration_s
        while not stop.is_set():
            wall = self.clock.wall()
            delay = min(1.0, math.floor(wall) + 1 - wall + TICK_OFFSET_S)
            if deadline is not None and self.clock.mono() + delay > deadline:
                break
            self.clock.sleep(delay, stop)
            if stop.is_set():
                break
            try:
                self.tick()
            except Exception as e:  # one bad second (disk error, ...) must not stop metering
                log.error("tick_failed", error=repr(e))

    def close(self) -> None:
        """Close the open records and make them durable (clean shutdown)."""
        records = self._close_records()
        self.spool.append(records, [])
        self.spool.flush()
        log.info("records_flushed", records=len(records), held=self.spool.held())


def _stopped_event(gpu_uuid: str, start: int, end: int) -> HealthEvent:
    """Seconds ``[start, end)`` passed between a GPU's last spooled record and this agent's first
    sample of it: the agent was stopped, killed or down (a SIGKILL loses the seconds since the
    last cut too). The id names the end, so each restart's report is its own event."""
    event = unmetered_event(gpu_uuid, start, end, "agent_stopped")
    return replace(
        event, event_id=event_id(gpu_uuid, start, EventKind.UNMETERED.value, f"stopped-{end}", 0)
    )


def _event_fields(event: HealthEvent) -> dict[str, object]:
    return {
        "gpu_uuid": event.gpu_uuid,
        "kind": event.kind.value,
        "code": event.code,
        "state": event.state.value if event.state else None,
        "rule": event.rule,
    }
