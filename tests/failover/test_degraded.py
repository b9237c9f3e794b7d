"""Migration on degradation (issue 42): a rented GPU degraded for its plan's time by a cause the
plan chose is failed over like a failed one, and billed by the plan's rules; the rental's
other GPUs are credited while its job is stalled."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine

from app.core.db import transaction
from app.core.epoch import from_epoch
from app.failover.degraded import check_degraded
from app.failover.service import FailoverSettings
from app.settings import get_settings
from tests.failover.conftest import PRICE, Fleet, iso
from tests.failover.test_billing import _cents, _invoice_lines, _period
from tests.metering.conftest import event, rec

THERMAL = {"rule": "clock_slowdown", "state": "degraded", "clock_event_reasons": "0x40"}
NVLINK_CRC = {"rule": "nvlink_crc_errors", "state": "degraded", "nvlink_crc_errors": 40}


def _degrade(fleet: Fleet, gpu: str, since: int, until: int, *evidence: dict[str, Any]) -> None:
    """The GPU's agent: healthy from t0, degraded from ``since`` to ``until`` (in the same
    minute), the state change carrying the classifier's evidence as the agent sends it."""
    change = event(
        gpu,
        since,
        "state_change",
        state="degraded",
        rule=evidence[0]["rule"],
        detail={"from": "healthy", "evidence": list(evidence)},
    )
    agent = fleet.agents[fleet.node_of[gpu]]
    records = [rec(gpu, fleet.t0, since), rec(gpu, since, until, "degraded")]
    agent.post(records, [change])


def _check(db: Engine, at: int) -> list[str]:
    """The worker's periodic check as of second ``at``; the GPUs it moved."""
    with transaction(db) as session:
        opened = check_degraded(session, from_epoch(at), FailoverSettings.of(get_settings()))
        return [f.failed_gpu_uuid for f in opened]


def _policy_plan(fleet: Fleet, name: str, after_s: int, causes: list[str]) -> str:
    prices = [
        {"gpu_model": "H100", "price_per_hour": PRICE, "effective_from": "2026-01-01T00:00:00Z"}
    ]
    body = {
        "name": name,
        "prices": prices,
        "migrate_degraded_after_s": after_s,
        "migrate_degraded_causes": causes,
    }
    return str(fleet.console.post("/v1/plans", body)["id"])


def _site(fleet: Fleet) -> None:
    fleet.node("node-1")
    fleet.node("node-2")
    for gpu in ("GPU-1", "GPU-2", "GPU-3", "GPU-4"):
        fleet.gpu("node-1", gpu)
    fleet.gpu("node-1", "S-NODE", "spare")
    fleet.gpu("node-2", "S-GROUP", "spare")


def test_a_gpu_degraded_long_enough_by_a_chosen_cause_is_failed_over(
    fleet: Fleet, db: Engine
) -> None:
    """Acme's plan moves GPUs after 30 s of thermal slowdown; Globex's plan migrates nothing.
    Acme's GPU-1 (thermal) moves; GPU-2 of the same rental (NVLink CRC: not chosen) and
    Globex's GPU-3 (thermal) stay."""
    _site(fleet)
    t0 = fleet.t0
    plain = fleet.plan_id
    fleet.plan_id = _policy_plan(fleet, "thermal-30", 30, ["thermal_slowdown"])
    acme = fleet.rental("GPU-1", "GPU-2")
    fleet.customer_id, fleet.plan_id = fleet.console.customer("Globex")["id"], plain
    globex = fleet.rental("GPU-3")
    _degrade(fleet, "GPU-1", t0 + 10, t0 + 35, THERMAL)
    _degrade(fleet, "GPU-2", t0 + 5, t0 + 60, NVLINK_CRC)
    _degrade(fleet, "GPU-3", t0 + 5, t0 + 60, THERMAL)
    assert _check(db, t0 + 35) == []  # 25 s degraded: not yet
    fleet.report("GPU-1", [(t0 + 35, t0 + 40, "degraded")])  # the open record's progress
    assert _check(db, t0 + 40) == ["GPU-1"]
    assert _check(db, t0 + 45) == []  # one try per degraded run
    [failover] = fleet.failovers(rental_id=acme)
    assert (failover["trigger"], failover["degraded_causes"]) == ("degraded", ["thermal_slowdown"])
    assert (failover["state"], failover["spare_gpu_uuid"]) == ("requested", "S-NODE")
    assert failover["failed_at"] == iso(t0 + 40)  # the second it was decided
    [evidence] = failover["evidence"]
    since, due = (from_epoch(t).isoformat() for t in (t0 + 10, t0 + 40))
    assert (evidence["degraded_since"], evidence["due_at"], evidence["after_s"]) == (since, due, 30)
    assert evidence["detail"]["evidence"] == [THERMAL]  # the state change that began the run
    [requested] = fleet.events("failover.requested")
    assert requested["data"]["trigger"] == "degraded"
    assert requested["data"]["degraded_causes"] == ["thermal_slowdown"]
    assert requested["data"]["credited_as"] is None
    assert fleet.failovers(rental_id=globex) == []


def test_the_plan_without_a_policy_and_the_unchosen_cause_stay(fleet: Fleet, db: Engine) -> None:
    _site(fleet)
    t0 = fleet.t0
    plain = fleet.plan_id
    fleet.plan_id = _policy_plan(fleet, "nvlink-20", 20, ["nvlink_down", "contained_ecc"])
    acme = fleet.rental("GPU-1")
    fleet.plan_id = plain
    fleet.customer_id = fleet.console.customer("Globex")["id"]
    globex = fleet.rental("GPU-3")
    _degrade(fleet, "GPU-1", t0 + 5, t0 + 60, THERMAL)  # a cause Acme's plan did not choose
    _degrade(fleet, "GPU-3", t0 + 5, t0 + 60, THERMAL)  # Globex's plan migrates nothing
    assert _check(db, t0 + 60) == []
    assert fleet.failovers(rental_id=acme) == fleet.failovers(rental_id=globex) == []


def test_the_migration_window_and_the_stalled_gpu_are_credited_degraded_time_billed(
    fleet: Fleet, db: Engine
) -> None:
    """A 2-GPU job: GPU-1 thermal-throttled from t0+10, moved at t0+40, running on S-NODE at
    t0+60; GPU-2 waits meanwhile. 1 cent per 10 s."""
    _site(fleet)
    t0 = fleet.t0
    fleet.plan_id = _policy_plan(fleet, "thermal-30", 30, ["thermal_slowdown"])
    rental = fleet.rental("GPU-1", "GPU-2")
    _degrade(fleet, "GPU-1", t0 + 10, t0 + 40, THERMAL)
    fleet.report("GPU-2", [(t0, t0 + 60, "healthy")])
    assert _check(db, t0 + 40) == ["GPU-1"]
    [failover] = fleet.failovers(rental_id=rental)
    path = f"/v1/failovers/{failover['id']}/resumed"
    fleet.console.post(path, {"resumed_at": iso(t0 + 60)}, 200)
    fleet.report("S-NODE", [(t0 + 60, t0 + 120, "healthy")])
    fleet.report("GPU-2", [(t0 + 60, t0 + 120, "healthy")])
    fleet.console.post(f"/v1/rentals/{rental}/end", {"end_at": iso(t0 + 120)}, 200)

    lines = _invoice_lines(fleet, fleet.customer_id, _period(t0))
    by_kind = {line["kind"]: (line["seconds"], line["amount"]) for line in lines}
    # 240 rented GPU-seconds: GPU-1's 30 degraded ones billed (the plan bills degraded), its
    # 20-s migration window credited, and GPU-2's 20 s of waiting credited as stall.
    assert by_kind["charge"] == (240, _cents(240, PRICE)) == (240, "0.24")
    assert by_kind["migration_credit"] == (20, "-0.02")
    stall = next(line for line in lines if line["kind"] == "stall_credit")
    assert (stall["gpu_uuid"], stall["seconds"], stall["amount"]) == ("GPU-2", 20, "-0.02")
    assert "degraded" not in by_kind and "failure_credit" not in by_kind
    migration = next(line for line in lines if line["kind"] == "migration_credit")
    assert (
        migration["evidence"]["reason"] == f"failover {failover['id']} (degraded: thermal_slowdown)"
    )


def test_with_no_free_spare_the_degraded_gpu_serves_on_billed_as_degraded(
    fleet: Fleet, db: Engine
) -> None:
    fleet.node("node-1")
    fleet.gpu("node-1", "GPU-1")
    t0 = fleet.t0
    fleet.plan_id = _policy_plan(fleet, "thermal-30", 30, ["thermal_slowdown"])
    rental = fleet.rental("GPU-1")
    _degrade(fleet, "GPU-1", t0 + 10, t0 + 45, THERMAL)
    assert _check(db, t0 + 45) == ["GPU-1"]
    assert _check(db, t0 + 50) == []  # not asked again while it stays degraded
    [failover] = fleet.failovers(rental_id=rental)
    assert (failover["state"], failover["spare_gpu_uuid"]) == ("no_spare", None)
    [event] = fleet.events("failover.no_spare")
    assert event["data"]["credited_as"] is None
    assert event["data"]["reason"] == (
        "no free H100 spare in fra1: the degraded GPU serves on, billed by the plan's degraded "
        "rule, until it is repaired"
    )
    fleet.report("GPU-1", [(t0 + 45, t0 + 60, "healthy")])  # repaired
    assert fleet.get(f"/v1/failovers/{failover['id']}")["state"] == "recovered"


def test_a_policy_names_known_causes_only(fleet: Fleet) -> None:
    body = {"name": "odd", "migrate_degraded_after_s": 30, "migrate_degraded_causes": ["hot"]}
    error = fleet.console.post("/v1/plans", body, 422)
    assert error["detail"][0]["loc"][:2] == ["body", "migrate_degraded_causes"]
    plan = fleet.console.post(
        "/v1/plans",
        {
            "name": "ok",
            "migrate_degraded_after_s": 30,
            "migrate_degraded_causes": ["nvlink_slow", "thermal_slowdown", "nvlink_slow"],
        },
    )
    assert plan["migrate_degraded_causes"] == ["nvlink_slow", "thermal_slowdown"]
    for body in (
        {"name": "no causes", "migrate_degraded_after_s": 30},
        {"name": "empty", "migrate_degraded_after_s": 30, "migrate_degraded_causes": []},
    ):
        error = fleet.console.post("/v1/plans", body, 422)["detail"][0]
        assert error["loc"] == ["body", "migrate_degraded_causes"]
        assert "thermal_slowdown" in error["msg"]
    assert plan["credit_stall"] is True
    off = fleet.client.patch(
        f"/v1/plans/{plan['id']}",
        json={"migrate_degraded_after_s": None},
        headers=fleet.console.headers,
    )
    assert off.status_code == 200, off.text
    assert off.json()["migrate_degraded_after_s"] is None


def test_the_latency_summary_keeps_degraded_moves_apart_from_failures(
    fleet: Fleet, db: Engine
) -> None:
    """A degraded move's clock starts at the policy's decision, a failure's at its first failed
    second: operators read the failure SLO (fault -> running) from the failures alone."""
    _site(fleet)
    t0 = fleet.t0
    fleet.plan_id = _policy_plan(fleet, "thermal-30", 30, ["thermal_slowdown"])
    fleet.rental("GPU-1")
    fleet.rental("GPU-3")
    _degrade(fleet, "GPU-1", t0 + 10, t0 + 40, THERMAL)
    assert _check(db, t0 + 40) == ["GPU-1"]
    failed_at = fleet.fail("GPU-3")
    moved, failed = sorted(fleet.failovers(), key=lambda f: f["trigger"])
    for failover, resumed_at in ((moved, t0 + 52), (failed, failed_at + 25)):
        path = f"/v1/failovers/{failover['id']}/resumed"
        fleet.console.post(path, {"resumed_at": iso(resumed_at)}, 200)
    sites = fleet.get("/v1/failovers/summary")["sites"]
    assert [(s["trigger"], s["failovers"], s["resume"]) for s in sites] == [
        ("degraded", 1, {"count": 1, "p50_s": 12.0, "p99_s": 12.0}),
        ("failed", 1, {"count": 1, "p50_s": 25.0, "p99_s": 25.0}),
    ]
