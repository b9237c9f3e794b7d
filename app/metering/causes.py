"""Why a GPU is degraded, by stable cause names: the one place the service names them.

The agent's classifier reports a degraded run with a state-change event whose detail lists the
rules firing (``metering_agent.classifier.RULES``; the segment's evidence keeps that event).
A newer agent also names each rule's cause (an evidence item's ``cause``); an older one does
not, so its rule names (and, for a clock slowdown, the NVML clock-event bits) are mapped here.
A spare policy chooses among these causes which ones migrate a rented GPU (``app.failover``).

API:
    DegradedCause, DEGRADED_CAUSES
    causes_of(evidence) -> frozenset[DegradedCause]
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from metering_agent.nvml.provider import (
    CLOCKS_EVENT_HW_POWER_BRAKE,
    CLOCKS_EVENT_HW_SLOWDOWN,
    CLOCKS_EVENT_HW_THERMAL,
    CLOCKS_EVENT_SW_THERMAL,
)


class DegradedCause(StrEnum):
    THERMAL_SLOWDOWN = "thermal_slowdown"  # clocks cut for temperature (SW or HW thermal)
    POWER_BRAKE = "power_brake"  # clocks cut by the external power-brake signal
    NVLINK_DOWN = "nvlink_down"  # a link went from up to down
    NVLINK_SLOW = "nvlink_slow"  # NVLink CRC / replay / recovery errors: the fabric retries
    CONTAINED_ECC = "contained_ecc"  # contained uncorrectable ECC (XID 94, Ampere and later)
    ROW_REMAP_PENDING = "row_remap_pending"  # a row (or page) waits for the next reset
    PCIE_REPLAY = "pcie_replay"  # PCIe replay storm


DEGRADED_CAUSES = frozenset(DegradedCause)

# Today's classifier rule names -> their cause (rules without one, e.g. a correctable-ECC burst
# or an advised recovery action, migrate nothing: no policy can choose them).
_RULE_CAUSES: dict[str, DegradedCause] = {
    "nvlink_down": DegradedCause.NVLINK_DOWN,
    "nvlink_crc_errors": DegradedCause.NVLINK_SLOW,
    "ecc_uncorrected_contained": DegradedCause.CONTAINED_ECC,
    "ecc_dbe_contained": DegradedCause.CONTAINED_ECC,
    "xid_94_contained_ecc": DegradedCause.CONTAINED_ECC,
    "row_remap_pending": DegradedCause.ROW_REMAP_PENDING,
    "retired_pages_pending": DegradedCause.ROW_REMAP_PENDING,
    "pcie_replay_storm": DegradedCause.PCIE_REPLAY,
}
_THERMAL_BITS = CLOCKS_EVENT_SW_THERMAL | CLOCKS_EVENT_HW_THERMAL


def _slowdown_causes(item: Mapping[str, Any]) -> set[DegradedCause]:
    """A clock slowdown by its NVML reason bits. ``HW_SLOWDOWN`` alone says "thermal or power
    brake" without which, so it counts as both (a policy choosing either migrates it)."""
    try:
        bits = int(str(item.get("clock_event_reasons", "0")), 0)
    except ValueError:
        bits = 0
    causes = set()
    if bits & (_THERMAL_BITS | CLOCKS_EVENT_HW_SLOWDOWN):
        causes.add(DegradedCause.THERMAL_SLOWDOWN)
    if bits & (CLOCKS_EVENT_HW_POWER_BRAKE | CLOCKS_EVENT_HW_SLOWDOWN):
        causes.add(DegradedCause.POWER_BRAKE)
    return causes


def _item_causes(item: Mapping[str, Any]) -> set[DegradedCause]:
    if (named := item.get("cause")) in DEGRADED_CAUSES:
        return {DegradedCause(named)}
    rule = str(item.get("rule", ""))
    if rule == "clock_slowdown":
        return _slowdown_causes(item)
    return {_RULE_CAUSES[rule]} if rule in _RULE_CAUSES else set()


def causes_of(evidence: Mapping[str, Any] | None) -> frozenset[DegradedCause]:
    """The degraded causes a segment's evidence (the state-change event that began the run)
    names: each degraded item of its ``detail.evidence``, else the event's own rule."""
    if not evidence:
        return frozenset()
    detail = evidence.get("detail")
    items = detail.get("evidence") if isinstance(detail, Mapping) else None
    if not isinstance(items, list) or not items:
        items = [evidence]
    causes: set[DegradedCause] = set()
    for item in items:
        if isinstance(item, Mapping) and item.get("state", "degraded") == "degraded":
            causes |= _item_causes(item)
    return frozenset(causes)
