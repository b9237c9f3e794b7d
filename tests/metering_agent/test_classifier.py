"""One test per classifier rule, plus stickiness, repair signals and the XID verdict kinds (every
catalog code is walked in test_xid_catalog.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from metering_agent.classifier import (
    CAUSES,
    DEGRADED_HOLD_S,
    MEMORY_ERROR_STATES,
    REPAIR_SIGNALS,
    RULES,
    HealthMemory,
    Verdict,
    classify,
)
from metering_agent.nvml.provider import (
    CLOCKS_EVENT_HW_POWER_BRAKE,
    CLOCKS_EVENT_HW_SLOWDOWN,
    CLOCKS_EVENT_HW_THERMAL,
    CLOCKS_EVENT_SW_POWER_CAP,
    CLOCKS_EVENT_SW_THERMAL,
    GpuReading,
)
from metering_agent.protocol import EventKind, GpuState

T0 = 1_700_000_000
F, D, H = GpuState.FAILED, GpuState.DEGRADED, GpuState.HEALTHY


def healthy(**fields: Any) -> GpuReading:
    base = GpuReading(
        0, "GPU-test", "NVIDIA H100 80GB HBM3",
        gpu_util=50, ecc_corrected_volatile=0, ecc_uncorrected_volatile=0,
        retired_pages_pending=False, remap_pending=False, remap_failure=False,
        nvlink_links=18, nvlink_links_down=0, nvlink_crc_errors=0, pcie_replays=0,
        nvlink_replay_errors=0, nvlink_recovery_errors=0,
        recovery_action=0, clock_event_reasons=0,
    )  # fmt: skip
    return replace(base, **fields)


def pre_ampere(**fields: Any) -> GpuReading:
    """Before Ampere: no row remapping (NVML answers "not supported"), page retirement instead."""
    return healthy(remap_pending=None, remap_failure=None, **fields)


def run(*readings: GpuReading, start: int = T0) -> tuple[list[Verdict], HealthMemory]:
    memory, verdicts = HealthMemory(), []
    for i, r in enumerate(readings):
        verdict, memory = classify(r, memory, start + i)
        verdicts.append(verdict)
    return verdicts, memory


def rules_of(verdict: Verdict) -> set[str]:
    return {ev.rule for ev in verdict.evidence}


# (rule, state, readings; the verdict on the last one is checked)
CONDITION_CASES = [
    ("gpu_lost", F, [healthy(lost=True, lost_reason="GPU is lost")]),
    ("ecc_uncorrected_volatile", F, [pre_ampere(ecc_uncorrected_volatile=1)]),
    ("ecc_uncorrected_volatile", F, [healthy(ecc_uncorrected_volatile=1, recovery_action=1)]),
    ("ecc_uncorrected_volatile", F, [healthy(ecc_uncorrected_volatile=1, remap_failure=True)]),
    ("ecc_uncorrected_contained", D, [healthy(ecc_uncorrected_volatile=1, remap_pending=True)]),
    ("ecc_dbe_event", F, [pre_ampere(dbe_events=1)]),
    ("ecc_dbe_contained", D, [healthy(dbe_events=1)]),
    ("row_remap_failure", F, [healthy(remap_failure=True)]),
    ("recovery_action_required", F, [healthy(recovery_action=1)]),  # reset
    ("recovery_action_required", F, [healthy(recovery_action=2)]),  # node reboot
    ("recovery_action_required", F, [healthy(recovery_action=4)]),  # drain and reset
    ("recovery_action_advised", D, [healthy(recovery_action=3)]),  # drain P2P
    ("row_remap_pending", D, [healthy(remap_pending=True)]),
    ("retired_pages_pending", D, [healthy(retired_pages_pending=True)]),
    ("retired_pages_limit", F, [pre_ampere(retired_pages_sbe=40, retired_pages_dbe=23)]),
    ("nvlink_down", F, [healthy(nvlink_links_down=2)]),  # DCGM: a link down is a failure
    ("nvlink_crc_errors", D, [healthy(nvlink_crc_errors=5), healthy(nvlink_crc_errors=500)]),
    ("nvlink_replay_errors", D, [healthy(nvlink_replay_errors=3), healthy(nvlink_replay_errors=4)]),
    ("nvlink_recovery_errors", D, [healthy(), healthy(nvlink_recovery_errors=1)]),
    ("pcie_replay_storm", D, [healthy(pcie_replays=0), healthy(pcie_replays=50)]),
    ("ecc_corrected_burst", D, [healthy(), healthy(ecc_corrected_volatile=900)]),
    ("thermal_slowdown", D, [healthy(clock_event_reasons=CLOCKS_EVENT_HW_THERMAL)]),
    ("thermal_slowdown", D, [healthy(clock_event_reasons=CLOCKS_EVENT_SW_THERMAL)]),
    ("power_brake", D, [healthy(clock_event_reasons=CLOCKS_EVENT_HW_POWER_BRAKE)]),
]  # fmt: skip


@pytest.mark.parametrize(("rule", "state", "readings"), CONDITION_CASES)
def test_condition_rule(rule: str, state: GpuState, readings: list[GpuReading]) -> None:
    verdicts, _ = run(*readings)
    assert verdicts[-1].state == state
    assert rule in rules_of(verdicts[-1])
    change = [e for e in verdicts[-1].events if e.kind == EventKind.STATE_CHANGE]
    assert change and change[0].state == state
    evidence = change[0].detail["evidence"]
    assert any(ev["rule"] == rule for ev in evidence), "a state change carries its evidence"
    [cause] = {ev["cause"] for ev in evidence if ev["rule"] == rule}
    assert CAUSES[cause] == state and cause in change[0].detail["causes"]


def test_every_rule_is_tested() -> None:
    tested = {case[0] for case in CONDITION_CASES}
    assert tested == {rule.name for rule in RULES}


def test_every_cause_is_emitted_by_some_rule_or_xid() -> None:
    from metering_agent.xid_catalog import CATALOG

    xids = {e.cause for e in CATALOG.values() if e.verdict != "customer"}
    emitted = {rule.cause for rule in RULES} | xids
    assert emitted | {"xid_unknown"} == set(CAUSES)


def test_contained_ecc_on_ampere_and_later_degrades_and_does_not_fail() -> None:
    """XID 94 raises the volatile uncorrectable count too; on an H100 the error is contained."""
    r = healthy(xids=[94], ecc_uncorrected_volatile=1, dbe_events=1, remap_pending=True)
    r.remapped_rows_uncorrectable = 1
    [verdict], _ = run(r)
    assert verdict.state == D
    assert rules_of(verdict) == {
        "xid_94_contained_error",
        "ecc_uncorrected_contained",
        "ecc_dbe_contained",
        "row_remap_pending",
    }
    assert {ev.cause for ev in verdict.evidence} == {"contained_ecc", "row_remap_pending"}
    remap = next(ev for ev in verdict.evidence if ev.rule == "row_remap_pending")
    assert remap.detail == {
        "remap_pending": True,
        "remapped_rows_correctable": None,
        "remapped_rows_uncorrectable": 1,
        "remap_histogram": None,
    }


def test_contained_ecc_stays_degraded_until_the_gpu_is_reset() -> None:
    """NVIDIA: the process that hit it dies, the GPU runs on and wants a reset when convenient."""
    memory = HealthMemory()
    _, memory = classify(healthy(xids=[94], ecc_uncorrected_volatile=1), memory, T0)
    verdict, memory = classify(healthy(ecc_uncorrected_volatile=1), memory, T0 + 7 * 86_400)
    assert verdict.state == D and "xid_94_contained_error" in rules_of(verdict)
    verdict, _ = classify(healthy(), memory, T0 + 7 * 86_400 + 1)  # reset: the count is zeroed
    assert verdict.state == H


def test_the_same_error_before_ampere_fails() -> None:
    [verdict], _ = run(pre_ampere(ecc_uncorrected_volatile=1))
    assert verdict.state == F


def test_memory_error_table_follows_nvidia_guidance() -> None:
    assert MEMORY_ERROR_STATES == {
        (False, False): F,  # before Ampere: a DBE needs a reset
        (False, True): F,
        (True, False): D,  # contained
        (True, True): F,  # remap failed / the driver wants a reset or reboot
    }


def test_xid_event_path_errors_are_events_only() -> None:
    [verdict], _ = run(healthy(event_errors=["nvmlEventSetWait_v2 failed: Unknown Error"]))
    assert verdict.state == H
    assert [(e.kind, e.rule) for e in verdict.events] == [
        (EventKind.NVML_ERROR, "xid_events_failed")
    ]


@pytest.mark.parametrize("xid", [13, 31, 43, 45, 68])
def test_application_xid_is_an_event_not_a_state(xid: int) -> None:
    [verdict], memory = run(healthy(xids=[xid]))
    assert verdict.state == H and memory.state == H and not verdict.evidence
    [event] = verdict.events
    assert (event.kind, event.code, event.detail["verdict"]) == (EventKind.XID, xid, "customer")


def test_unknown_xid_is_shown_degraded_and_never_passes_as_nothing() -> None:
    verdicts, _ = run(healthy(xids=[999]), healthy())
    assert [v.state for v in verdicts] == [D, D]
    unknown = [e for e in verdicts[0].events if e.kind == EventKind.XID_UNKNOWN]
    assert [(e.code, e.rule) for e in unknown] == [(999, "xid_999_unknown")]
    assert not any(e.kind == EventKind.XID for e in verdicts[0].events)
    [change] = [e for e in verdicts[0].events if e.kind == EventKind.STATE_CHANGE]
    assert change.detail["causes"] == ["xid_unknown"]


def test_nvlink5_xid_follows_the_drivers_recovery_action() -> None:
    """144-150: NVIDIA's action depends on a sub-code NVML does not give; the driver's does."""
    verdicts, _ = run(healthy(xids=[149], recovery_action=0), healthy(recovery_action=0))
    assert [v.state for v in verdicts] == [D, D]
    assert {ev.cause for ev in verdicts[0].evidence} == {"nvlink_error"}
    verdicts, _ = run(healthy(xids=[149], recovery_action=0), healthy(recovery_action=1))
    assert [v.state for v in verdicts] == [D, F]
    verdicts, memory = run(healthy(xids=[149], recovery_action=None), healthy(recovery_action=None))
    assert [v.state for v in verdicts] == [F, F], "no recovery action to read: failed"
    assert "xid_149_nvlink_netir_error" in memory.latched()


def test_a_burst_of_xids_is_one_piece_of_evidence_each_and_fits_the_services_bound() -> None:
    codes = [79] * 5 + list(range(140, 173)) + [999, 1000]
    [verdict], _ = run(healthy(xids=codes))
    assert [ev.rule for ev in verdict.evidence].count("xid_79_gpu_has_fallen_off_the_bus") == 1
    [change] = [e for e in verdict.events if e.kind == EventKind.STATE_CHANGE]
    shown = len(change.detail["evidence"])
    assert shown + change.detail["evidence_omitted"] == len(verdict.evidence)
    assert len(json.dumps(change.detail).encode()) <= 8192  # DETAIL_MAX_BYTES, service side


def test_power_cap_is_not_a_slowdown() -> None:
    [verdict], _ = run(healthy(clock_event_reasons=CLOCKS_EVENT_SW_POWER_CAP))
    assert verdict.state == H


def test_counter_jump_is_reported_with_its_delta() -> None:
    verdicts, _ = run(healthy(pcie_replays=10), healthy(pcie_replays=60))
    [counter] = [e for e in verdicts[-1].events if e.kind == EventKind.COUNTER]
    assert counter.rule == "pcie_replay_storm" and counter.detail["pcie_replays"] == 50


def test_counter_reset_is_not_a_jump() -> None:
    verdicts, _ = run(healthy(pcie_replays=5000), healthy(pcie_replays=3))
    assert verdicts[-1].state == H


def test_failing_xid_holds_until_the_gpu_is_repaired_not_on_a_timer() -> None:
    memory = HealthMemory()
    verdict, memory = classify(healthy(xids=[119]), memory, T0)
    assert verdict.state == F
    for later in (T0 + 300, T0 + 86_400, T0 + 30 * 86_400):
        verdict, memory = classify(healthy(), memory, later)
        assert verdict.state == F and not verdict.events, "no reset seen: still failed"
    assert list(memory.latched()) == ["xid_119_gsp_rpc_timeout"]


def test_recover_clears_latched_failure() -> None:
    verdicts, memory = run(healthy(xids=[79], lost=True), healthy(recovered=True))
    assert [v.state for v in verdicts] == [F, H]
    assert memory.held == {}
    [change] = verdicts[1].events
    assert change.detail["repaired"] == "gpu_answers_again"


@pytest.mark.parametrize("signal", REPAIR_SIGNALS)
def test_each_repair_signal_going_down_clears_the_latch(signal: str) -> None:
    before = healthy(energy_mj=9_000_000, ecc_corrected_volatile=4, ecc_uncorrected_volatile=2,
                     remap_pending=True, retired_pages_pending=True, xids=[48])  # fmt: skip
    after = replace(before, xids=[])
    setattr(after, signal, 0)
    verdicts, memory = run(before, replace(before, xids=[]), after)
    assert [v.state for v in verdicts][:2] == [F, F]
    assert "xid_48_gpu_ecc_dbe" not in memory.latched()
    change = next(e for e in verdicts[2].events if e.kind == EventKind.STATE_CHANGE)
    assert change.detail["repaired"] == f"{signal}_went_down"


def test_repair_signals_going_up_are_not_a_repair() -> None:
    before = healthy(energy_mj=9_000_000, ecc_corrected_volatile=4, xids=[64])
    after = healthy(energy_mj=9_500_000, ecc_corrected_volatile=5, remap_pending=True)
    later = replace(after, energy_mj=9_600_000)
    verdicts, _ = run(before, after, later)
    assert [v.state for v in verdicts] == [F, F, F]


def test_a_lost_gpu_reads_no_repair_signal() -> None:
    verdicts, _ = run(healthy(xids=[79], energy_mj=5), healthy(lost=True), healthy(energy_mj=6))
    assert [v.state for v in verdicts] == [F, F, F]


def test_power_brake_is_its_own_cause_not_a_thermal_one() -> None:
    brake = healthy(clock_event_reasons=CLOCKS_EVENT_HW_POWER_BRAKE | CLOCKS_EVENT_HW_SLOWDOWN)
    [verdict], _ = run(brake)
    assert {ev.cause for ev in verdict.evidence} == {"power_brake"}


def test_slowdown_degrades_for_a_minute_after_it_ends() -> None:
    memory = HealthMemory()
    _, memory = classify(healthy(clock_event_reasons=CLOCKS_EVENT_HW_THERMAL), memory, T0)
    verdict, memory = classify(healthy(), memory, T0 + DEGRADED_HOLD_S - 1)
    assert verdict.state == D
    verdict, _ = classify(healthy(), memory, T0 + DEGRADED_HOLD_S)
    assert verdict.state == H


def test_condition_rules_clear_with_the_condition() -> None:
    verdicts, _ = run(healthy(remap_pending=True), healthy())
    assert [v.state for v in verdicts] == [D, H]


def test_worst_state_wins() -> None:
    [verdict], _ = run(pre_ampere(retired_pages_pending=True, ecc_uncorrected_volatile=2))
    assert verdict.state == F
    assert rules_of(verdict) == {"retired_pages_pending", "ecc_uncorrected_volatile"}


def test_unsupported_fields_are_healthy() -> None:
    bare = GpuReading(0, "GPU-test", "L40S", unsupported={"nvlink_links": "Not Supported"})
    verdicts, _ = run(bare, bare)
    assert [v.state for v in verdicts] == [H, H]
    assert not verdicts[0].events


def test_event_ids_are_deterministic() -> None:
    a, _ = run(healthy(xids=[13, 13]))
    b, _ = run(healthy(xids=[13, 13]))
    ids = [e.event_id for e in a[0].events]
    assert ids == [e.event_id for e in b[0].events] and len(set(ids)) == 2
