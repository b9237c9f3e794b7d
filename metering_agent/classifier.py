"""Health classifier: a pure, table-driven function from one GPU's reading to its state.

``classify(reading, memory, now)`` returns the verdict (state, the evidence behind it, the health
events to report) and the memory to pass in next second. Rules follow NVIDIA's own tools (DCGM
health watches, k8s-device-plugin, the XID catalogue):

- failed: GPU lost / off the bus (or NVML hung past the sample bound, or every call failing with
  Unknown Error), uncorrectable memory errors that are not contained (see below), row-remap
  failure, a recovery action of reset / reboot / drain-and-reset, and fatal XIDs (48, 64, 74,
  79, 95, 119, 120, 140);
- degraded: XID 94 and contained uncorrectable memory errors, retired-page or row-remap pending,
  NVLink links gone from up to down, NVLink CRC errors, PCIe replay storms, correctable-ECC
  bursts, thermal or power-brake slowdown;
- application XIDs (13, 31, 43, 45, 68, 109) and unknown XIDs are events only, and so are
  failures of the XID event path (``nvml_error`` events: XIDs may be missing).

Uncorrectable memory errors (the volatile uncorrected ECC count and the driver's DBE events) are
decided as NVIDIA's memory-error guidance describes (GPU Memory Error Management, A100 and
later): before Ampere (no row remapping reported) a DBE needs a GPU reset, so the GPU is failed.
From Ampere on errors are contained: the page is offlined, the GPU keeps serving other work and
the row is remapped at the next reset, so the GPU is degraded unless remapping failed or the
driver asks for a reset or reboot (``MEMORY_ERROR_STATES``).

How long a state sticks:

- condition rules (lost, ECC counts, remap flags, NVLink down, recovery action) hold exactly while
  the condition reads true: volatile ECC counts and remap flags only clear with a GPU reset;
- fatal XIDs latch ``failed`` for ``FATAL_XID_HOLD_S`` after the last one, or until the GPU is
  reset (``reading.recovered``: the simulator's ``recover``);
- event-like degraded rules (XID 94, counter bursts, slowdowns) hold ``DEGRADED_HOLD_S`` after the
  last time they fired, i.e. a slowdown flags the GPU for a minute after it ends.

The state is the worst of the rules firing now and the rules still held.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from metering_agent.nvml.provider import (
    CLOCKS_EVENT_HW_POWER_BRAKE,
    CLOCKS_EVENT_HW_SLOWDOWN,
    CLOCKS_EVENT_HW_THERMAL,
    CLOCKS_EVENT_SW_THERMAL,
    RECOVERY_ACTIONS,
    GpuReading,
)
from metering_agent.protocol import SEVERITY, EventKind, GpuState, HealthEvent

FATAL_XID_HOLD_S = 300
DEGRADED_HOLD_S = 60

# Per-second counter increases that count as a burst / storm.
NVLINK_CRC_PER_S = 10
PCIE_REPLAYS_PER_S = 8
ECC_CORRECTED_PER_S = 100

SLOWDOWN_MASK = (
    CLOCKS_EVENT_HW_SLOWDOWN
    | CLOCKS_EVENT_SW_THERMAL
    | CLOCKS_EVENT_HW_THERMAL
    | CLOCKS_EVENT_HW_POWER_BRAKE
)
FAILING_RECOVERY_ACTIONS = {1, 2, 4, 6, 7}  # reset, reboot, drain-and-reset, bus reset, sys reboot
DEGRADING_RECOVERY_ACTIONS = {3, 5}  # drain P2P, recover IMEX domain

# (row remapping reported, i.e. Ampere or later; remap failed or the driver wants a reset or
# reboot) -> the state an uncorrectable memory error puts the GPU in.
MEMORY_ERROR_STATES: dict[tuple[bool, bool], GpuState] = {
    (False, False): GpuState.FAILED,  # before Ampere: a DBE needs a reset
    (False, True): GpuState.FAILED,
    (True, False): GpuState.DEGRADED,  # contained: page offlined, row remapped at next reset
    (True, True): GpuState.FAILED,  # not repairable in place
}

# XID -> (rule name, state, hold seconds). Others are events only.
XID_RULES: dict[int, tuple[str, GpuState, int]] = {
    48: ("xid_48_double_bit_ecc", GpuState.FAILED, FATAL_XID_HOLD_S),
    64: ("xid_64_ecc_remap_failure", GpuState.FAILED, FATAL_XID_HOLD_S),
    74: ("xid_74_nvlink_error", GpuState.FAILED, FATAL_XID_HOLD_S),
    79: ("xid_79_fallen_off_bus", GpuState.FAILED, FATAL_XID_HOLD_S),
    95: ("xid_95_uncontained_ecc", GpuState.FAILED, FATAL_XID_HOLD_S),
    119: ("xid_119_gsp_rpc_timeout", GpuState.FAILED, FATAL_XID_HOLD_S),
    120: ("xid_120_gsp_error", GpuState.FAILED, FATAL_XID_HOLD_S),
    140: ("xid_140_unrecovered_ecc", GpuState.FAILED, FATAL_XID_HOLD_S),
    94: ("xid_94_contained_ecc", GpuState.DEGRADED, DEGRADED_HOLD_S),
}
APPLICATION_XIDS: dict[int, str] = {
    13: "xid_13_graphics_engine_exception",
    31: "xid_31_gpu_memory_page_fault",
    43: "xid_43_gpu_stopped_processing",
    45: "xid_45_preemptive_cleanup",
    68: "xid_68_video_processor_exception",
    109: "xid_109_context_switch_timeout",
}

COUNTERS = (
    "ecc_corrected_volatile",
    "ecc_uncorrected_volatile",
    "nvlink_crc_errors",
    "pcie_replays",
)
Deltas = dict[str, int]


@dataclass(frozen=True, slots=True)
class Evidence:
    rule: str
    state: GpuState
    code: int | None = None  # XID
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Rule:
    name: str
    state: GpuState
    check: Callable[[GpuReading, Deltas], dict[str, Any] | None]  # evidence detail, or None
    hold_s: int = 0  # 0: holds only while the condition reads true
    counter: bool = False  # a counter jump: also reported as a ``counter`` event


def _flag(attr: str) -> Callable[[GpuReading, Deltas], dict[str, Any] | None]:
    return lambda r, _d: {attr: True} if getattr(r, attr) else None


def _positive(attr: str) -> Callable[[GpuReading, Deltas], dict[str, Any] | None]:
    def check(r: GpuReading, d: Deltas) -> dict[str, Any] | None:
        value = getattr(r, attr)
        return {attr: value, "delta": d.get(attr, 0)} if value else None

    return check


def _burst_rule(name: str, attr: str, per_s: int) -> Rule:
    """A counter rising by ``per_s`` or more in one second; flags the GPU for a minute."""

    def check(_r: GpuReading, d: Deltas) -> dict[str, Any] | None:
        return {attr: d[attr], "threshold": per_s} if d.get(attr, 0) >= per_s else None

    return Rule(name, GpuState.DEGRADED, check, DEGRADED_HOLD_S, counter=True)


def _recovery(actions: set[int]) -> Callable[[GpuReading, Deltas], dict[str, Any] | None]:
    def check(r: GpuReading, _d: Deltas) -> dict[str, Any] | None:
        if r.recovery_action in actions:
            return {"recovery_action": RECOVERY_ACTIONS.get(r.recovery_action, r.recovery_action)}
        return None

    return check


def memory_error_state(r: GpuReading) -> GpuState:
    needs_reset = bool(r.remap_failure) or r.recovery_action in FAILING_RECOVERY_ACTIONS
    return MEMORY_ERROR_STATES[(r.remap_pending is not None, needs_reset)]


def _memory_error(
    state: GpuState, check: Callable[[GpuReading, Deltas], dict[str, Any] | None]
) -> Callable[[GpuReading, Deltas], dict[str, Any] | None]:
    """``check``, when the GPU's generation and remap state make the error ``state``."""
    return lambda r, d: check(r, d) if memory_error_state(r) == state else None


def _remap(attr: str) -> Callable[[GpuReading, Deltas], dict[str, Any] | None]:
    def check(r: GpuReading, _d: Deltas) -> dict[str, Any] | None:
        if not getattr(r, attr):
            return None
        return {
            attr: True,
            "remapped_rows_correctable": r.remapped_rows_correctable,
            "remapped_rows_uncorrectable": r.remapped_rows_uncorrectable,
        }

    return check


def _lost(r: GpuReading, _d: Deltas) -> dict[str, Any] | None:
    return {"reason": r.lost_reason} if r.lost else None


def _dbe_event(r: GpuReading, _d: Deltas) -> dict[str, Any] | None:
    return {"dbe_events": r.dbe_events} if r.dbe_events else None


def _slowdown(r: GpuReading, _d: Deltas) -> dict[str, Any] | None:
    reasons = (r.clock_event_reasons or 0) & SLOWDOWN_MASK
    return {"clock_event_reasons": hex(reasons)} if reasons else None


F, D = GpuState.FAILED, GpuState.DEGRADED
RULES: tuple[Rule, ...] = (
    Rule("gpu_lost", F, _lost),
    Rule("ecc_uncorrected_volatile", F, _memory_error(F, _positive("ecc_uncorrected_volatile"))),
    Rule("ecc_dbe_event", F, _memory_error(F, _dbe_event), hold_s=FATAL_XID_HOLD_S),
    Rule("row_remap_failure", F, _remap("remap_failure")),
    Rule("recovery_action_required", F, _recovery(FAILING_RECOVERY_ACTIONS)),
    Rule("recovery_action_advised", D, _recovery(DEGRADING_RECOVERY_ACTIONS)),
    Rule("ecc_uncorrected_contained", D, _memory_error(D, _positive("ecc_uncorrected_volatile"))),
    Rule("ecc_dbe_contained", D, _memory_error(D, _dbe_event), hold_s=DEGRADED_HOLD_S),
    Rule("row_remap_pending", D, _remap("remap_pending")),
    Rule("retired_pages_pending", D, _flag("retired_pages_pending")),
    Rule("nvlink_down", D, _positive("nvlink_links_down")),
    _burst_rule("nvlink_crc_errors", "nvlink_crc_errors", NVLINK_CRC_PER_S),
    _burst_rule("pcie_replay_storm", "pcie_replays", PCIE_REPLAYS_PER_S),
    _burst_rule("ecc_corrected_burst", "ecc_corrected_volatile", ECC_CORRECTED_PER_S),
    Rule("clock_slowdown", D, _slowdown, DEGRADED_HOLD_S),
)


@dataclass(frozen=True, slots=True)
class HealthMemory:
    """What the classifier carries from one second to the next."""

    state: GpuState = GpuState.HEALTHY
    counters: dict[str, int] = field(default_factory=dict)
    held: dict[str, tuple[Evidence, int]] = field(default_factory=dict)  # rule -> (evidence, until)


@dataclass(frozen=True, slots=True)
class Verdict:
    state: GpuState
    evidence: list[Evidence]  # every rule firing now or still held
    events: list[HealthEvent]


def counter_deltas(previous: dict[str, int], r: GpuReading) -> Deltas:
    """Increase since last second; a counter that went down was reset, so count from zero."""
    deltas: Deltas = {}
    for name in COUNTERS:
        value = getattr(r, name)
        if value is None or name not in previous:
            continue
        deltas[name] = value - previous[name] if value >= previous[name] else value
    return deltas


def event_id(gpu_uuid: str, at: int, kind: str, key: str | int | None, ordinal: int) -> str:
    """Deterministic, so the same observation always gets the same id."""
    return str(uuid.uuid5(uuid.NAMESPACE_OID, f"{gpu_uuid}|{at}|{kind}|{key}|{ordinal}"))


def _xid_evidence(code: int) -> tuple[Evidence, int]:
    if code in XID_RULES:
        rule, state, hold_s = XID_RULES[code]
        return Evidence(rule, state, code), hold_s
    return Evidence(APPLICATION_XIDS.get(code, f"xid_{code}"), GpuState.HEALTHY, code), 0


def classify(r: GpuReading, memory: HealthMemory, now: int) -> tuple[Verdict, HealthMemory]:
    deltas = counter_deltas(memory.counters, r)
    held = {} if r.recovered else dict(memory.held)
    firing: list[Evidence] = []
    events: list[HealthEvent] = []

    def fire(evidence: Evidence, hold_s: int) -> None:
        firing.append(evidence)
        if hold_s:
            held[evidence.rule] = (evidence, now + hold_s)

    for rule in RULES:
        detail = rule.check(r, deltas)
        if detail is None:
            continue
        fire(Evidence(rule.name, rule.state, None, detail), rule.hold_s)
        if rule.counter:
            events.append(
                _event(r.uuid, now, EventKind.COUNTER, len(events), rule=rule.name, detail=detail)
            )
    for code in r.xids:
        xid, hold_s = _xid_evidence(code)
        if xid.state != GpuState.HEALTHY:
            fire(xid, hold_s)
        events.append(_event(r.uuid, now, EventKind.XID, len(events), code=code, rule=xid.rule))

    for message in r.event_errors:
        events.append(
            _event(
                r.uuid,
                now,
                EventKind.NVML_ERROR,
                len(events),
                rule="xid_events_failed",
                detail={"error": message},
            )
        )

    held = {name: (ev, until) for name, (ev, until) in held.items() if until > now}
    fired = {ev.rule for ev in firing}
    evidence = firing + [ev for name, (ev, _) in held.items() if name not in fired]
    state = max((ev.state for ev in evidence), key=SEVERITY.__getitem__, default=GpuState.HEALTHY)
    if state != memory.state:
        detail = {"from": memory.state.value, "evidence": [_evidence_json(ev) for ev in evidence]}
        cause = evidence[0].rule if evidence else "cleared"
        events.append(
            _event(
                r.uuid,
                now,
                EventKind.STATE_CHANGE,
                len(events),
                state=state,
                rule=cause,
                detail=detail,
            )
        )
    counters = {name: getattr(r, name) for name in COUNTERS if getattr(r, name) is not None}
    # A lost GPU reads no counters: keep the last ones so its return is not a jump.
    counters = {**memory.counters, **counters} if r.lost else counters
    return Verdict(state, evidence, events), HealthMemory(state, counters, held)


def _evidence_json(ev: Evidence) -> dict[str, Any]:
    out: dict[str, Any] = {"rule": ev.rule, "state": ev.state.value, **ev.detail}
    if ev.code is not None:
        out["xid"] = ev.code
    return out


def _event(gpu_uuid: str, at: int, kind: EventKind, ordinal: int, **fields: Any) -> HealthEvent:
    key = fields.get("code") or fields.get("rule")
    return HealthEvent(
        event_id(gpu_uuid, at, kind.value, key, ordinal), gpu_uuid, at, kind, **fields
    )
