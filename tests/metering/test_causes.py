"""The service's degraded cause names (app.metering.causes) read off what today's agent sends:
the classifier's own state-change event for each degraded condition, as ingest stores it as
the segment's evidence; a newer agent's ``cause`` is taken as sent."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from app.metering.causes import DEGRADED_CAUSES, DegradedCause, causes_of
from metering_agent.classifier import HealthMemory, classify
from metering_agent.nvml.provider import (
    CLOCKS_EVENT_HW_POWER_BRAKE,
    CLOCKS_EVENT_HW_SLOWDOWN,
    CLOCKS_EVENT_HW_THERMAL,
    CLOCKS_EVENT_SW_POWER_CAP,
    CLOCKS_EVENT_SW_THERMAL,
    GpuReading,
)
from metering_agent.protocol import EventKind

T0 = 1_700_000_000
C = DegradedCause
BASE = GpuReading(
    0, "GPU-test", "NVIDIA H100 80GB HBM3",
    ecc_corrected_volatile=0, ecc_uncorrected_volatile=0, retired_pages_pending=False,
    remap_pending=False, remap_failure=False, nvlink_links=18, nvlink_links_down=0,
    nvlink_crc_errors=0, pcie_replays=0, recovery_action=0, clock_event_reasons=0,
)  # fmt: skip


def _stored_evidence(**fault: Any) -> dict[str, Any] | None:
    """The agent's state-change event for a healthy reading then ``fault``, in the shape ingest
    attaches to the segment it begins (event id, rule, code, at, detail)."""
    _, memory = classify(BASE, HealthMemory(), T0)
    verdict, _ = classify(replace(BASE, **fault), memory, T0 + 1)
    changes = [e for e in verdict.events if e.kind == EventKind.STATE_CHANGE]
    if not changes:
        return None
    [change] = changes
    return {"event_id": change.event_id, "rule": change.rule, "code": change.code,
            "at": change.at, "detail": change.detail}  # fmt: skip


@pytest.mark.parametrize(
    ("fault", "causes"),
    [
        ({"clock_event_reasons": CLOCKS_EVENT_HW_THERMAL}, {C.THERMAL_SLOWDOWN}),
        ({"clock_event_reasons": CLOCKS_EVENT_SW_THERMAL}, {C.THERMAL_SLOWDOWN}),
        ({"clock_event_reasons": CLOCKS_EVENT_HW_POWER_BRAKE}, {C.POWER_BRAKE}),
        # "HW slowdown" without the power-brake bit: the agent reads it as thermal.
        ({"clock_event_reasons": CLOCKS_EVENT_HW_SLOWDOWN}, {C.THERMAL_SLOWDOWN}),
        ({"nvlink_crc_errors": 500}, {C.NVLINK_SLOW}),
        ({"ecc_uncorrected_volatile": 1}, {C.CONTAINED_ECC}),  # Ampere+: contained
        ({"xids": [94]}, {C.CONTAINED_ECC}),
        ({"remap_pending": True}, {C.ROW_REMAP_PENDING}),
        ({"retired_pages_pending": True}, {C.ROW_REMAP_PENDING}),
        ({"pcie_replays": 100}, {C.PCIE_REPLAY}),
        # Degraded, but no cause a policy can choose: never moves a GPU.
        ({"ecc_corrected_volatile": 1000}, set()),
        ({"recovery_action": 3}, set()),
        # Two conditions at once: both causes.
        (
            {"nvlink_crc_errors": 500, "clock_event_reasons": CLOCKS_EVENT_HW_THERMAL},
            {C.NVLINK_SLOW, C.THERMAL_SLOWDOWN},
        ),
    ],
)
def test_each_degraded_condition_the_agent_reports_maps_to_its_cause(
    fault: dict[str, Any], causes: set[DegradedCause]
) -> None:
    evidence = _stored_evidence(**fault)
    assert evidence is not None and evidence["detail"]["evidence"]
    assert causes_of(evidence) == causes


def test_a_power_cap_is_not_a_slowdown_and_a_failure_is_no_degraded_cause() -> None:
    assert _stored_evidence(clock_event_reasons=CLOCKS_EVENT_SW_POWER_CAP) is None  # healthy
    failed = _stored_evidence(xids=[79])
    assert failed is not None and causes_of(failed) == set()
    # A link down fails the GPU (DCGM's verdict): the failure's failover moves it, at once.
    link_down = _stored_evidence(nvlink_links_down=2)
    assert link_down is not None and causes_of(link_down) == set()


def test_a_newer_agents_cause_is_taken_as_sent_and_odd_evidence_names_nothing() -> None:
    named = {"rule": "some_future_rule", "state": "degraded", "cause": "nvlink_slow"}
    assert causes_of({"rule": "x", "detail": {"evidence": [named]}}) == {C.NVLINK_SLOW}
    unknown = {"rule": "clock_slowdown", "state": "degraded", "cause": "gremlins",
               "clock_event_reasons": "not hex"}  # fmt: skip
    assert causes_of({"detail": {"evidence": [unknown]}}) == set()
    assert causes_of({"rule": "nvlink_down"}) == {C.NVLINK_DOWN}  # an event with no detail
    for odd in (None, {}, {"detail": "text"}, {"detail": {"evidence": ["text", 3]}}):
        assert causes_of(odd) == set()
    assert {c.value for c in DEGRADED_CAUSES} == {
        "thermal_slowdown", "power_brake", "nvlink_down", "nvlink_slow", "contained_ecc",
        "row_remap_pending", "pcie_replay",
    }  # fmt: skip
