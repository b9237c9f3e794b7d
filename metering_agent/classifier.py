"""Health classifier: a pure, table-driven function from one GPU's reading to its state.

``classify(reading, memory, now)`` returns the verdict (state, the evidence behind it, the health
events to report) and the memory to pass in next second. Rules follow NVIDIA's own sources: the
XID catalog (``xid_catalog``: every code with NVIDIA's immediate action), DCGM's health watches
(docs/dcgm-parity.md) and NVIDIA's GPU memory error guidance. Each rule and its source is listed
in metering_agent/README.md.

- failed: GPU lost / off the bus (or NVML hung past the sample bound, or every call failing with
  Unknown Error), uncorrectable memory errors that are not contained (see below), row-remap
  failure, retired pages at DCGM's limit, a driver recovery action of reset / reboot /
  drain-and-reset, an NVLink link down, and every XID whose catalog action is a GPU reset, a
  node reboot or support (``Verdict.FAILED``);
- degraded: contained uncorrectable memory errors (XID 94), retired-page or row-remap pending,
  NVLink CRC, replay or recovery errors, PCIe replay storms, correctable-ECC bursts, thermal or
  power-brake slowdown, NVLink5 / C2C XIDs whose action the driver's recovery action decides,
  and XIDs the catalog does not list (also reported as ``xid_unknown`` events);
- application XIDs (the catalog's "restart the application" and "ignore") are events only, and
  so are failures of the XID event path (``nvml_error`` events: XIDs may be missing).

Uncorrectable memory errors (the volatile uncorrected ECC count and the driver's DBE events) are
decided as NVIDIA's memory-error guidance describes (GPU Memory Error Management, A100 and
later): before Ampere (no row remapping reported) a DBE needs a GPU reset, so the GPU is failed.
From Ampere on errors are contained: the page is offlined, the GPU keeps serving other work and
the row is remapped at the next reset, so the GPU is degraded unless remapping failed or the
driver asks for a reset or reboot (``MEMORY_ERROR_STATES``).

How long a state sticks:

- condition rules (lost, ECC counts, remap flags, NVLink down, recovery action) hold exactly while
  the condition reads true: volatile ECC counts and remap flags only clear with a GPU reset;
- failing XIDs and DBE events, and XID 94, are latched **until the GPU is seen repaired**, never
  on a timer: ``repair_signal`` names what proves a reset or driver reload (a lost GPU answering
  again, volatile ECC counts, the energy counter or a pending remap / page retirement going
  down). The latch survives an agent restart (``latch``; a new boot id there is a node reboot);
- event-like degraded rules (counter bursts, slowdowns, unknown XIDs) hold ``DEGRADED_HOLD_S``
  after the last time they fired, i.e. a slowdown flags the GPU for a minute after it ends.

The state is the worst of the rules firing now and the rules still held. Every piece of evidence
names its ``cause`` (``CAUSES``), a stable name the service can act on (migrate on chosen
degraded causes); XID evidence carries NVIDIA's description and immediate action.
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
from metering_agent.xid_catalog import CATALOG, CATALOG_VERSION, XidEntry
from metering_agent.xid_catalog import Verdict as XidVerdict

DEGRADED_HOLD_S = 60
EVIDENCE_MAX = 12  # pieces of evidence in one state change (the rest are counted)
LATCHED = None  # a held rule's "until": held until the GPU is seen repaired

# Per-second counter increases that count as a burst / storm.
NVLINK_CRC_PER_S = 10
PCIE_REPLAYS_PER_S = 8
ECC_CORRECTED_PER_S = 100
# DCGM's limit (dcgm_gpu_hardware_limits.h, DCGM_LIMIT_MAX_RETIRED_PAGES): fail at this many.
RETIRED_PAGES_LIMIT = 63

THERMAL_MASK = CLOCKS_EVENT_HW_SLOWDOWN | CLOCKS_EVENT_SW_THERMAL | CLOCKS_EVENT_HW_THERMAL
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

COUNTERS = (
    "ecc_corrected_volatile",
    "ecc_uncorrected_volatile",
    "nvlink_crc_errors",
    "nvlink_replay_errors",
    "nvlink_recovery_errors",
    "pcie_replays",
)
# Readings that only go down when the GPU is reset or its driver re-initialises it: volatile ECC
# counts (zeroed at driver load), the energy counter (since the driver last loaded) and the
# pending remap / page retirement flags (applied, so cleared, at the next reset or reload).
REPAIR_SIGNALS = (
    "ecc_corrected_volatile",
    "ecc_uncorrected_volatile",
    "energy_mj",
    "remap_pending",
    "retired_pages_pending",
)
Deltas = dict[str, int]

# Every cause name the classifier emits, by state. Stable: the service selects on them.
CAUSES: dict[str, GpuState] = {
    "gpu_lost": GpuState.FAILED,
    "uncorrectable_ecc": GpuState.FAILED,
    "row_remap_failure": GpuState.FAILED,
    "retired_pages_limit": GpuState.FAILED,
    "recovery_action": GpuState.FAILED,
    "nvlink_down": GpuState.FAILED,
    "xid_failure": GpuState.FAILED,
    "contained_ecc": GpuState.DEGRADED,
    "row_remap_pending": GpuState.DEGRADED,
    "retired_pages_pending": GpuState.DEGRADED,
    "recovery_action_advised": GpuState.DEGRADED,
    "nvlink_slow": GpuState.DEGRADED,
    "nvlink_error": GpuState.DEGRADED,
    "c2c_error": GpuState.DEGRADED,
    "pcie_replay": GpuState.DEGRADED,
    "ecc_corrected_burst": GpuState.DEGRADED,
    "thermal_slowdown": GpuState.DEGRADED,
    "power_brake": GpuState.DEGRADED,
    "xid_unknown": GpuState.DEGRADED,
}


@dataclass(frozen=True, slots=True)
class Evidence:
    rule: str
    state: GpuState
    cause: str
    code: int | None = None  # XID
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Rule:
    name: str
    state: GpuState
    cause: str
    check: Callable[[GpuReading, Deltas], dict[str, Any] | None]  # evidence detail, or None
    hold_s: int | None = 0  # 0: holds only while the condition reads true; LATCHED: until repair
    counter: bool = False  # a counter jump: also reported as a ``counter`` event


def _flag(attr: str) -> Callable[[GpuReading, Deltas], dict[str, Any] | None]:
    return lambda r, _d: {attr: True} if getattr(r, attr) else None


def _positive(attr: str) -> Callable[[GpuReading, Deltas], dict[str, Any] | None]:
    def check(r: GpuReading, d: Deltas) -> dict[str, Any] | None:
        value = getattr(r, attr)
        return {attr: value, "delta": d.get(attr, 0)} if value else None

    return check


def _burst_rule(name: str, cause: str, attr: str, per_s: int) -> Rule:
    """A counter rising by ``per_s`` or more in one reading; flags the GPU for a minute."""

    def check(_r: GpuReading, d: Deltas) -> dict[str, Any] | None:
        return {attr: d[attr], "threshold": per_s} if d.get(attr, 0) >= per_s else None

    return Rule(name, GpuState.DEGRADED, cause, check, DEGRADED_HOLD_S, counter=True)


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
            "remap_histogram": r.remap_histogram,
        }

    return check


def _retired_pages_limit(r: GpuReading, _d: Deltas) -> dict[str, Any] | None:
    total = (r.retired_pages_sbe or 0) + (r.retired_pages_dbe or 0)
    if total < RETIRED_PAGES_LIMIT:
        return None
    return {"sbe": r.retired_pages_sbe, "dbe": r.retired_pages_dbe, "limit": RETIRED_PAGES_LIMIT}


def _lost(r: GpuReading, _d: Deltas) -> dict[str, Any] | None:
    return {"reason": r.lost_reason} if r.lost else None


def _dbe_event(r: GpuReading, _d: Deltas) -> dict[str, Any] | None:
    return {"dbe_events": r.dbe_events} if r.dbe_events else None


def _slowdown(mask: int) -> Callable[[GpuReading, Deltas], dict[str, Any] | None]:
    def check(r: GpuReading, _d: Deltas) -> dict[str, Any] | None:
        reasons = r.clock_event_reasons or 0
        if reasons & CLOCKS_EVENT_HW_POWER_BRAKE and mask != CLOCKS_EVENT_HW_POWER_BRAKE:
            reasons &= ~CLOCKS_EVENT_HW_SLOWDOWN  # the HW slowdown that comes with a power brake
        return {"clock_event_reasons": hex(reasons & mask)} if reasons & mask else None

    return check


F, D = GpuState.FAILED, GpuState.DEGRADED
RULES: tuple[Rule, ...] = (
    Rule("gpu_lost", F, "gpu_lost", _lost),
    Rule(
        "ecc_uncorrected_volatile",
        F,
        "uncorrectable_ecc",
        _memory_error(F, _positive("ecc_uncorrected_volatile")),
    ),
    Rule("ecc_dbe_event", F, "uncorrectable_ecc", _memory_error(F, _dbe_event), LATCHED),
    Rule("row_remap_failure", F, "row_remap_failure", _remap("remap_failure")),
    Rule("retired_pages_limit", F, "retired_pages_limit", _retired_pages_limit),
    Rule("recovery_action_required", F, "recovery_action", _recovery(FAILING_RECOVERY_ACTIONS)),
    Rule("nvlink_down", F, "nvlink_down", _positive("nvlink_links_down")),
    Rule(
        "recovery_action_advised",
        D,
        "recovery_action_advised",
        _recovery(DEGRADING_RECOVERY_ACTIONS),
    ),
    Rule(
        "ecc_uncorrected_contained",
        D,
        "contained_ecc",
        _memory_error(D, _positive("ecc_uncorrected_volatile")),
    ),
    Rule("ecc_dbe_contained", D, "contained_ecc", _memory_error(D, _dbe_event), LATCHED),
    Rule("row_remap_pending", D, "row_remap_pending", _remap("remap_pending")),
    Rule("retired_pages_pending", D, "retired_pages_pending", _flag("retired_pages_pending")),
    _burst_rule("nvlink_crc_errors", "nvlink_slow", "nvlink_crc_errors", NVLINK_CRC_PER_S),
    _burst_rule("nvlink_replay_errors", "nvlink_slow", "nvlink_replay_errors", 1),
    _burst_rule("nvlink_recovery_errors", "nvlink_slow", "nvlink_recovery_errors", 1),
    _burst_rule("pcie_replay_storm", "pcie_replay", "pcie_replays", PCIE_REPLAYS_PER_S),
    _burst_rule(
        "ecc_corrected_burst", "ecc_corrected_burst", "ecc_corrected_volatile", ECC_CORRECTED_PER_S
    ),
    Rule("thermal_slowdown", D, "thermal_slowdown", _slowdown(THERMAL_MASK), DEGRADED_HOLD_S),
    Rule("power_brake", D, "power_brake", _slowdown(CLOCKS_EVENT_HW_POWER_BRAKE), DEGRADED_HOLD_S),
)


@dataclass(frozen=True, slots=True)
class HealthMemory:
    """What the classifier carries from one second to the next (and, latched, across restarts)."""

    state: GpuState = GpuState.HEALTHY
    counters: dict[str, int] = field(default_factory=dict)  # COUNTERS and REPAIR_SIGNALS
    # rule -> (evidence, until): until a second, or LATCHED (until the GPU is seen repaired)
    held: dict[str, tuple[Evidence, int | None]] = field(default_factory=dict)
    repaired: str | None = None  # a repair seen before this reading (a reboot, from ``latch``)

    def latched(self) -> dict[str, Evidence]:
        return {name: ev for name, (ev, until) in self.held.items() if until is LATCHED}


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


def repair_signal(previous: dict[str, int], r: GpuReading) -> str | None:
    """What proves the GPU was reset or re-initialised since ``previous``, or None."""
    if r.recovered:
        return "gpu_answers_again"
    for name in REPAIR_SIGNALS:
        value = getattr(r, name)
        if value is not None and name in previous and int(value) < previous[name]:
            return f"{name}_went_down"
    return None


def _readings(r: GpuReading) -> dict[str, int]:
    names = dict.fromkeys((*COUNTERS, *REPAIR_SIGNALS))
    return {name: int(getattr(r, name)) for name in names if getattr(r, name) is not None}


def event_id(gpu_uuid: str, at: int, kind: str, key: str | int | None, ordinal: int) -> str:
    """Deterministic, so the same observation always gets the same id."""
    return str(uuid.uuid5(uuid.NAMESPACE_OID, f"{gpu_uuid}|{at}|{kind}|{key}|{ordinal}"))


def xid_detail(entry: XidEntry) -> dict[str, Any]:
    """What a customer and an operator read about an XID: NVIDIA's words and action."""
    return {
        "mnemonic": entry.mnemonic,
        "description": entry.description,
        "nvidia_action": entry.action.value or None,
        "verdict": entry.verdict.value,
    }


def _xid(code: int, r: GpuReading) -> tuple[Evidence | None, int | None]:
    """The evidence an XID adds (None for the customer's) and how long it holds."""
    entry = CATALOG.get(code)
    if entry is None:
        detail = {"description": f"not in the agent's XID catalog ({CATALOG_VERSION})"}
        return Evidence(f"xid_{code}_unknown", D, "xid_unknown", code, detail), DEGRADED_HOLD_S
    detail = xid_detail(entry)
    match entry.verdict:
        case XidVerdict.CUSTOMER:
            return None, 0
        case XidVerdict.FAILED:
            return Evidence(entry.rule, F, entry.cause, code, detail), LATCHED
        case XidVerdict.DEGRADED:
            return Evidence(entry.rule, D, entry.cause, code, detail), LATCHED
        case XidVerdict.DRIVER if r.recovery_action is None:
            detail["recovery_action"] = "unreadable: failed until repaired"
            return Evidence(entry.rule, F, "xid_failure", code, detail), LATCHED
    return Evidence(entry.rule, D, entry.cause, code, detail), DEGRADED_HOLD_S


def classify(r: GpuReading, memory: HealthMemory, now: int) -> tuple[Verdict, HealthMemory]:
    deltas = counter_deltas(memory.counters, r)
    repaired = memory.repaired or repair_signal(memory.counters, r)
    held = {} if repaired else dict(memory.held)
    firing: list[Evidence] = []
    events: list[HealthEvent] = []

    def fire(evidence: Evidence, hold_s: int | None) -> None:
        if any(ev.rule == evidence.rule for ev in firing):
            return  # the same XID twice in a second is one piece of evidence
        firing.append(evidence)
        if hold_s is LATCHED:
            held[evidence.rule] = (evidence, LATCHED)
        elif hold_s:
            held[evidence.rule] = (evidence, now + hold_s)

    for rule in RULES:
        detail = rule.check(r, deltas)
        if detail is None:
            continue
        fire(Evidence(rule.name, rule.state, rule.cause, None, detail), rule.hold_s)
        if rule.counter:
            events.append(
                _event(r.uuid, now, EventKind.COUNTER, len(events), rule=rule.name, detail=detail)
            )
    for code in r.xids:
        xid, hold_s = _xid(code, r)
        if xid is not None:
            fire(xid, hold_s)
        kind = EventKind.XID if code in CATALOG else EventKind.XID_UNKNOWN
        name = xid.rule if xid is not None else CATALOG[code].rule
        detail = xid.detail if xid is not None else xid_detail(CATALOG[code])
        events.append(_event(r.uuid, now, kind, len(events), code=code, rule=name, detail=detail))

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

    held = {
        name: (ev, until) for name, (ev, until) in held.items() if until is LATCHED or until > now
    }
    fired = {ev.rule for ev in firing}
    evidence = firing + [ev for name, (ev, _) in held.items() if name not in fired]
    state = max((ev.state for ev in evidence), key=SEVERITY.__getitem__, default=GpuState.HEALTHY)
    if state != memory.state:
        detail = {
            "from": memory.state.value,
            "causes": sorted({ev.cause for ev in evidence}),
            "evidence": [_evidence_json(ev) for ev in evidence[:EVIDENCE_MAX]],
        }
        if len(evidence) > EVIDENCE_MAX:  # the service bounds an event's detail (8 KiB)
            detail["evidence_omitted"] = len(evidence) - EVIDENCE_MAX
        if repaired:
            detail["repaired"] = repaired
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
    counters = _readings(r)
    # A lost GPU reads nothing: keep the last values so its return is neither a jump nor a repair.
    counters = {**memory.counters, **counters} if r.lost else counters
    return Verdict(state, evidence, events), HealthMemory(state, counters, held)


def _evidence_json(ev: Evidence) -> dict[str, Any]:
    out: dict[str, Any] = {"rule": ev.rule, "state": ev.state.value, "cause": ev.cause, **ev.detail}
    if ev.code is not None:
        out["xid"] = ev.code
    return out


def _event(gpu_uuid: str, at: int, kind: EventKind, ordinal: int, **fields: Any) -> HealthEvent:
    key = fields.get("code") or fields.get("rule")
    return HealthEvent(
        event_id(gpu_uuid, at, kind.value, key, ordinal), gpu_uuid, at, kind, **fields
    )
