"""Every code of NVIDIA's XID catalog, walked through the classifier: the state it gives, whether
the customer is credited, whether the GPU fails over, and how long it holds.

The service's meaning of each state (DESIGN.md): ``failed`` is credited and starts a failover;
``degraded`` and ``healthy`` are billed and fail nothing over (a spare policy may migrate on
chosen degraded causes, decided by the service).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from metering_agent.classifier import HealthMemory, classify
from metering_agent.nvml.provider import GpuReading
from metering_agent.protocol import EventKind, GpuState
from metering_agent.xid_catalog import (
    ACTION_VERDICTS,
    CATALOG,
    CATALOG_SOURCE,
    CATALOG_VERSION,
    DECISIONS,
    PRODUCTS,
    Action,
    Verdict,
)

T0 = 1_700_000_000
DAY = 86_400
F, D, H = GpuState.FAILED, GpuState.DEGRADED, GpuState.HEALTHY


@dataclass(frozen=True)
class Outcome:
    state: GpuState  # right after the XID
    credited: bool
    failover: bool
    state_a_day_later: GpuState  # with no reset in between


OUTCOMES = {
    Verdict.CUSTOMER: Outcome(H, credited=False, failover=False, state_a_day_later=H),
    Verdict.FAILED: Outcome(F, credited=True, failover=True, state_a_day_later=F),
    Verdict.DEGRADED: Outcome(D, credited=False, failover=False, state_a_day_later=D),
    # the driver's recovery action (here: none needed) decides; the flag lasts a minute
    Verdict.DRIVER: Outcome(D, credited=False, failover=False, state_a_day_later=H),
}

# Read off NVIDIA's catalog by hand, independently of the table: a typo there fails here.
KNOWN = {
    13: Verdict.CUSTOMER,  # Graphics Engine Exception: RESTART_APP
    31: Verdict.CUSTOMER,  # GPU memory page fault: RESTART_APP
    43: Verdict.CUSTOMER,  # GPU stopped processing (software fault): IGNORE
    45: Verdict.CUSTOMER,  # preemptive cleanup: WORKFLOW_XID_45
    68: Verdict.CUSTOMER,  # NVDEC0 exception: RESTART_APP
    46: Verdict.FAILED,  # GPU stopped processing: RESET_GPU
    48: Verdict.FAILED,  # double bit ECC error: WORKFLOW_XID_48
    54: Verdict.FAILED,  # auxiliary power not connected: CHECK_MECHANICALS
    62: Verdict.FAILED,  # internal micro-controller halt: RESET_GPU
    63: Verdict.CUSTOMER,  # row remapping event: IGNORE (the pending remap degrades)
    64: Verdict.FAILED,  # row remapping failure: RESET_GPU
    74: Verdict.FAILED,  # NVLink error: WORKFLOW_NVLINK_ERR (reset or reboot to clear)
    79: Verdict.FAILED,  # fallen off the bus: RESTART_BM
    92: Verdict.CUSTOMER,  # high single-bit ECC rate: IGNORE
    94: Verdict.DEGRADED,  # contained memory error: RESTART_APP, reset when convenient
    95: Verdict.FAILED,  # uncontained memory error: RESET_GPU
    109: Verdict.FAILED,  # context switch timeout: RESET_GPU
    119: Verdict.FAILED,  # GSP RPC timeout: RESET_GPU
    120: Verdict.FAILED,  # GSP error: RESET_GPU
    137: Verdict.CUSTOMER,  # NVLink privilege error (an application's bad access): IGNORE
    140: Verdict.FAILED,  # ECC unrecovered error: RESET_GPU
    144: Verdict.DRIVER,  # NVLink5 errors: by sub-code
    150: Verdict.DRIVER,
    154: Verdict.CUSTOMER,  # recovery action changed: the recovery-action rule reads it
    155: Verdict.FAILED,  # NVLink SW defined error: RESET_GPU
    156: Verdict.FAILED,  # resource retirement event: RESET_GPU
    158: Verdict.FAILED,  # GPU fatal timeout: RESET_GPU
}


def test_the_catalog_names_its_source_and_version_and_lists_every_code() -> None:
    assert CATALOG_SOURCE.startswith("https://docs.nvidia.com/deploy/xid-errors/")
    assert "2026-09-09" in CATALOG_VERSION and "1-172" in CATALOG_VERSION
    assert sorted(CATALOG) == list(range(1, 173))
    for entry in CATALOG.values():
        assert entry.description and entry.mnemonic, entry.code
        assert set(entry.applies_to) <= set(PRODUCTS)


def test_every_catalog_action_has_a_verdict_or_the_code_a_decision() -> None:
    for entry in CATALOG.values():
        if entry.code in DECISIONS:
            assert DECISIONS[entry.code][1], "a decision says why"
        else:
            assert entry.verdict == ACTION_VERDICTS[entry.action], entry.code
    no_action = {e.code for e in CATALOG.values() if e.action == Action.NONE}
    assert no_action == set(range(162, 173)) and no_action <= set(DECISIONS)


@pytest.mark.parametrize("code", sorted(KNOWN))
def test_known_codes_read_as_nvidia_files_them(code: int) -> None:
    assert CATALOG[code].verdict == KNOWN[code]


@pytest.mark.parametrize("code", sorted(CATALOG))
def test_every_code(code: int) -> None:
    entry = CATALOG[code]
    expected = OUTCOMES[entry.verdict]
    memory = HealthMemory()
    reading = GpuReading(0, "GPU-walk", "NVIDIA H100 80GB HBM3", recovery_action=0, xids=[code])
    verdict, memory = classify(reading, memory, T0)

    assert verdict.state == expected.state
    assert (verdict.state == F) == expected.credited == expected.failover
    [xid] = [e for e in verdict.events if e.code == code]
    assert (xid.kind, xid.rule) == (EventKind.XID, entry.rule)
    assert xid.detail["description"] == entry.description, "NVIDIA's words reach the service"
    assert xid.detail["nvidia_action"] == (entry.action.value or None)
    if expected.state != H:
        [change] = [e for e in verdict.events if e.kind == EventKind.STATE_CHANGE]
        [evidence] = change.detail["evidence"]
        assert (evidence["xid"], evidence["description"]) == (code, entry.description)
        assert change.detail["causes"] == [entry.cause]

    quiet = GpuReading(0, "GPU-walk", "NVIDIA H100 80GB HBM3", recovery_action=0)
    later, memory = classify(quiet, memory, T0 + DAY)
    assert later.state == expected.state_a_day_later
    reset = GpuReading(0, "GPU-walk", "NVIDIA H100 80GB HBM3", recovery_action=0, recovered=True)
    repaired, _ = classify(reset, memory, T0 + DAY + 1)
    assert repaired.state == H, "a reset repairs whatever the XID left"


@pytest.mark.parametrize("code", sorted(c for c, e in CATALOG.items() if e.verdict == "driver"))
def test_driver_decided_codes_fail_when_the_recovery_action_is_unreadable(code: int) -> None:
    reading = GpuReading(0, "GPU-walk", "NVIDIA B200", recovery_action=None, xids=[code])
    verdict, memory = classify(reading, HealthMemory(), T0)
    assert verdict.state == F
    later, _ = classify(GpuReading(0, "GPU-walk", "NVIDIA B200"), memory, T0 + DAY)
    assert later.state == F
