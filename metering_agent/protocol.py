"""The agent <-> service wire format, defined once and imported by both sides.

Standard library only: the agent is deployed on GPU nodes without the service.
A batch is JSON: ``{"protocol_version", "batch_id", "records": [...], "events": [...]}``.

A usage record states a fact about one GPU: it was in ``state`` for every second of
``[start, end)`` (integer UTC epoch seconds), with these aggregate readings. Records never
cross a UTC minute boundary, so per-minute charts built from them are exact.

What a record means since #15 (same wire format, same ``PROTOCOL_VERSION``): a record is *any*
run of consecutive same-state seconds of one GPU within one minute, not necessarily a maximal
one. The agent cuts its open records at every upload round (default every 2 s, at a per-agent
jittered offset), at once when a tick brings a health event (a state change included), at a
state change, at a minute boundary and at a missing second. A steady GPU therefore sends one
record per upload round instead of one per minute; every second is still sent in exactly one
record, closed records are durable in the spool before they are sent, so the service's view
lags by at most one upload interval and a SIGKILL loses at most the seconds since the last cut.

Why a cut never double-counts:
- Records are closed, never extended or re-cut once spooled: the next record of a GPU starts at
  the previous one's end (the spool's per-GPU floor survives restarts), so no second is in two
  records. A re-sent record is identical (same batch, same seconds), a duplicate.
- Segments: the service merges adjacent runs of one state into one maximal segment, so
  ``[0, 2) + [2, 4)`` stores exactly what ``[0, 4)`` stores; evidence stays the first's.
- Minute metrics: the service keeps sums, counts and maxima per minute (``packing``), so the
  records of one minute combine exactly: observed seconds, utilisation sums and maxima add up
  the same however the minute is cut. Energy is the one rounded sum (the service keeps
  decijoules per record): the agent reports whole decijoules as increases of the GPU's rounded
  running total, so a cut minute's records add up to exactly the uncut record's energy.
- Means are sent rounded to 0.01 % and multiplied back by ``sample_count`` on the service: exact
  for records of at most 60 samples (the error is at most 0.3 of one unit before rounding).

Older agents (one record per minute or state run) send the same shape and keep working.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

PROTOCOL_VERSION = 1
INGEST_PATH = "/v1/ingest"
MINUTE = 60


class GpuState(StrEnum):
    """Health states the agent can observe (``maintenance`` is the operator's, not the agent's)."""

    HEALTHY = "healthy"
    DEGRADED = "degraded"
    FAILED = "failed"


# Worst is highest: the classifier keeps the worst state firing, metrics export these numbers.
SEVERITY = {GpuState.HEALTHY: 0, GpuState.DEGRADED: 1, GpuState.FAILED: 2}


class EventKind(StrEnum):
    XID = "xid"  # an XID error reported by the driver (code = XID number)
    # An XID NVIDIA's catalog (the agent's xid_catalog version) does not list: for the operator.
    XID_UNKNOWN = "xid_unknown"
    STATE_CHANGE = "state_change"  # the classifier moved the GPU to another state
    COUNTER = "counter"  # a health counter jumped (ECC, NVLink CRC, PCIe replay, ...)
    CLOCK_JUMP = "clock_jump"  # wall clock moved against the monotonic clock; seconds skipped
    NVML_ERROR = "nvml_error"  # the XID event path failed: XIDs may be missing
    # Seconds [detail.start, detail.end) of the GPU the agent could not meter or keep
    # (detail.reason: agent_paused, clock_jump, spool_full), so a gap in the timeline has a cause.
    UNMETERED = "unmetered"


@dataclass(frozen=True, slots=True)
class UsageRecord:
    gpu_uuid: str
    model: str  # NVML device name, used to register a GPU on its first report
    start: int  # inclusive, epoch seconds
    end: int  # exclusive, epoch seconds
    state: GpuState
    sample_count: int  # seconds actually sampled in [start, end)
    gpu_util_mean: float | None = None  # percent
    gpu_util_max: int | None = None  # percent
    mem_util_mean: float | None = None  # percent (memory controller busy)
    mem_used_max_mib: int | None = None
    mem_total_mib: int | None = None
    energy_j: float | None = None  # joules consumed over the run
    power_max_w: float | None = None
    temp_max_c: int | None = None
    sm_clock_mean_mhz: int | None = None
    # The GPU's NVML index on its node, which a scheduler's GPU numbering follows (Slurm's GRES
    # IDX with AutoDetect=nvml or File= lines in the same order): how a job's GPU indices become
    # UUIDs. Optional: older agents do not send it.
    device_index: int | None = None
    # Its device's minor number (NVML's nvmlDeviceGetMinorNumber: /dev/nvidia<minor>), what a
    # scheduler's device files name (Slurm's gres.conf ``File=``): a GPU's identity on its node
    # whatever order NVML and the scheduler number GPUs in. Optional: older agents do not send
    # it, and the service falls back to ``device_index``.
    minor_number: int | None = None


@dataclass(frozen=True, slots=True)
class HealthEvent:
    event_id: str  # stable id chosen by the agent; the service stores each id once
    gpu_uuid: str
    at: int  # epoch second the event was observed
    kind: EventKind
    code: int | None = None  # XID number for kind=xid
    state: GpuState | None = None  # new state for kind=state_change
    rule: str | None = None  # classifier rule that fired, e.g. "xid_79_gpu_has_fallen_off_the_bus"
    detail: dict[str, Any] = field(default_factory=dict)  # evidence: counter deltas, messages


@dataclass(frozen=True, slots=True)
class IngestBatch:
    batch_id: str  # stable across retries
    records: list[UsageRecord] = field(default_factory=list)
    events: list[HealthEvent] = field(default_factory=list)
    protocol_version: int = PROTOCOL_VERSION


class Withheld(StrEnum):
    """Why an item of a stored batch was not stored with it."""

    # Two nodes claimed its GPU's UUID: the service keeps it until an operator settles the
    # clash, then stores it (its node got the GPU) or reports it refused. Do not re-send it.
    HELD = "held"
    # Not kept (the GPU was retired or settled to another node, or its hold is full): the
    # reason says why. Re-sending changes nothing; keep it for a person to look at.
    REFUSED = "refused"


@dataclass(frozen=True, slots=True)
class ItemAnswer:
    """The answer for one item of a batch that was not stored with the rest of it."""

    loc: tuple[str | int, ...]  # ("records", 3) or ("events", 0)
    gpu_uuid: str
    outcome: Withheld
    reason: str


@dataclass(frozen=True, slots=True)
class IngestResult:
    batch_id: str
    accepted: int
    duplicates: int
    events_accepted: int
    events_duplicate: int
    # Items not stored with the batch (its other items were), one answer each: empty unless
    # a GPU's UUID is in dispute. Older agents ignore it: held items are kept all the same.
    not_stored: list[ItemAnswer] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class FieldError:
    """One problem with one item, located like pydantic's ``loc``: e.g. ("records", 3, "end")."""

    loc: tuple[str | int, ...]
    msg: str


def minute_start(second: int) -> int:
    return second - second % MINUTE


def record_errors(
    record: UsageRecord, index: int, *, now: int | None = None, max_skew_s: int = 10
) -> list[FieldError]:
    """Semantic checks on one record, beyond field types. Empty when the record is valid."""
    loc: tuple[str | int, ...] = ("records", index)
    now = int(time.time()) if now is None else now
    errors: list[FieldError] = []
    if record.start >= record.end:
        errors.append(
            FieldError((*loc, "end"), f"end {record.end} must be after start {record.start}")
        )
    elif record.end > minute_start(record.start) + MINUTE:
        errors.append(
            FieldError(
                (*loc, "end"),
                f"record [{record.start}, {record.end}) crosses the minute boundary at "
                f"{minute_start(record.start) + MINUTE}; split it there",
            )
        )
    if record.end > now + max_skew_s:
        errors.append(
            FieldError(
                (*loc, "end"),
                f"end {record.end} is {record.end - now} s in the future "
                f"(allowed clock skew {max_skew_s} s)",
            )
        )
    if record.start < record.end and not 0 <= record.sample_count <= record.end - record.start:
        errors.append(
            FieldError(
                (*loc, "sample_count"),
                f"sample_count {record.sample_count} must be within 0..{record.end - record.start}",
            )
        )
    return errors


def event_errors(
    event: HealthEvent, index: int, *, now: int | None = None, max_skew_s: int = 10
) -> list[FieldError]:
    loc: tuple[str | int, ...] = ("events", index)
    now = int(time.time()) if now is None else now
    errors: list[FieldError] = []
    if event.at > now + max_skew_s:
        errors.append(
            FieldError((*loc, "at"), f"at {event.at} is {event.at - now} s in the future")
        )
    if event.kind in (EventKind.XID, EventKind.XID_UNKNOWN) and event.code is None:
        errors.append(FieldError((*loc, "code"), "an xid event needs its XID code"))
    if event.kind == EventKind.STATE_CHANGE and event.state is None:
        errors.append(FieldError((*loc, "state"), "a state_change event needs the new state"))
    return errors
