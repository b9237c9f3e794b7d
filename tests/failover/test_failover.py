"""The failover controller through the API: a rented GPU reported failed by its agent opens a
failover with a chosen, reserved spare (or none); the orchestrator's answers move the rental."""

from __future__ import annotations

from datetime import datetime, timedelta
from uuid import UUID

import pytest
from sqlalchemy import Engine, text

from app.auth.models import KeyKind
from app.auth.service import issue_key
from app.core.db import transaction
from app.failover import transitions
from app.settings import get_settings
from tests.failover.conftest import Fleet, iso
from tests.harness import bearer
from tests.metering.conftest import rec

CONTRACT_KEYS = {
    "failover_id",
    "rental_id",
    "customer_id",
    "failed_gpu_uuid",
    "spare_gpu_uuid",
    "datacenter",
    "model",
    "topology_group",
    "failed_at",
    "detected_at",
    "requested_at",
    "reserved_until",
    "evidence",
}


def _spare_site(fleet: Fleet) -> None:
    """fra1: node-1 (group nvl-a) with the rented GPU-1..3 and spare S-NODE; node-2 (nvl-a)
    with spare S-GROUP; node-3 (nvl-b) with spare S-DC and an A100 spare; ams1: S-AMS."""
    fleet.node("node-1")
    fleet.node("node-2")
    fleet.node("node-3", group="nvl-b")
    fleet.node("node-ams", datacenter="ams1")
    for gpu in ("GPU-1", "GPU-2", "GPU-3", "GPU-4"):
        fleet.gpu("node-1", gpu)
    fleet.gpu("node-1", "S-NODE", "spare")
    fleet.gpu("node-2", "S-GROUP", "spare")
    fleet.gpu("node-3", "S-DC", "spare")
    fleet.gpu("node-3", "S-A100", "spare", model="A100")
    fleet.gpu("node-ams", "S-AMS", "spare")


def test_spare_is_chosen_same_group_and_node_then_group_then_datacenter(fleet: Fleet) -> None:
    _spare_site(fleet)
    rentals = [fleet.rental(gpu) for gpu in ("GPU-1", "GPU-2", "GPU-3", "GPU-4")]
    chosen: list[tuple[str, str | None]] = []
    for gpu in ("GPU-1", "GPU-2", "GPU-3", "GPU-4"):
        fleet.fail(gpu)
        [failover] = fleet.failovers(rental_id=rentals[len(chosen)])
        chosen.append((failover["state"], failover["spare_gpu_uuid"]))
    # Never another datacenter's spare, never another model's.
    assert chosen == [
        ("requested", "S-NODE"),
        ("requested", "S-GROUP"),
        ("requested", "S-DC"),
        ("no_spare", None),
    ]


def test_requested_event_carries_the_contract_and_the_first_failed_second(
    fleet: Fleet,
) -> None:
    _spare_site(fleet)
    rental = fleet.rental("GPU-1")
    failed_at = fleet.fail("GPU-1", at=fleet.t0 + 17)
    [event] = fleet.events("failover.requested")
    data = event["data"]
    assert set(data) >= CONTRACT_KEYS
    assert (data["rental_id"], data["customer_id"]) == (rental, fleet.customer_id)
    assert (data["failed_gpu_uuid"], data["spare_gpu_uuid"]) == ("GPU-1", "S-NODE")
    assert (data["datacenter"], data["model"], data["topology_group"]) == ("fra1", "H100", "nvl-a")
    assert datetime.fromisoformat(data["failed_at"]).timestamp() == failed_at
    requested = datetime.fromisoformat(data["requested_at"])
    assert datetime.fromisoformat(data["reserved_until"]) - requested == timedelta(seconds=120)
    assert event["subject"] == f"failover/{data['failover_id']}"
    assert event["customer_id"] == fleet.customer_id


@pytest.mark.parametrize("order", [("GPU-1", "GPU-2"), ("GPU-2", "GPU-1")])
def test_several_gpus_of_one_rental_failing_at_once_get_one_failover_each(
    fleet: Fleet, order: tuple[str, str]
) -> None:
    """Failures of the same second take the spares in GPU order, whatever the batch's order
    and the order Postgres finds the GPUs' rows in (the one written last moves): the same
    spares every time."""
    _spare_site(fleet)
    rental = fleet.rental("GPU-1", "GPU-2")
    agent = fleet.agents["node-1"]
    t0 = fleet.t0
    for gpu in order:  # each GPU's row rewritten in turn
        agent.post([rec(gpu, t0, t0 + 30)])
    agent.post([rec(g, t0 + 30, t0 + 60, "failed") for g in order])
    agent.post([rec("GPU-1", t0 + 60, t0 + 90, "failed")])  # the failure goes on: no new one
    failovers = fleet.failovers(rental_id=rental)
    spares = sorted((f["failed_gpu_uuid"], f["spare_gpu_uuid"]) for f in failovers)
    assert spares == [("GPU-1", "S-NODE"), ("GPU-2", "S-GROUP")]


def test_resumed_moves_the_rental_once_and_answers_the_same_again(fleet: Fleet) -> None:
    _spare_site(fleet)
    rental = fleet.rental("GPU-1")
    failed_at = fleet.fail("GPU-1")
    [failover] = fleet.failovers()
    path = f"/v1/failovers/{failover['id']}"
    resumed_at = iso(failed_at + 25)
    first = fleet.console.post(f"{path}/resumed", {"resumed_at": resumed_at}, 200)
    again = fleet.console.post(f"{path}/resumed", {"resumed_at": iso(failed_at + 40)}, 200)
    assert first == again
    assert (first["state"], first["resumed_at"]) == ("resumed", resumed_at)
    moved = fleet.get(f"/v1/rentals/{rental}")
    assert [(a["gpu_uuid"], a["start_at"], a["end_at"]) for a in moved["assignments"]] == [
        ("GPU-1", iso(fleet.t0), iso(failed_at)),
        ("S-NODE", resumed_at, None),
    ]
    [migration] = moved["migrations"]
    assert migration["id"] == first["migration_id"]
    assert [e["data"]["downtime_s"] for e in fleet.events("rental.migrated")] == [25]
    assert len(fleet.events("failover.resumed")) == 1
    assert fleet.get("/v1/gpus/S-NODE")["pool"] == "rentable"  # it serves the rental now
    wrong = fleet.console.post(f"{path}/abandoned", {"reason": "late"}, 409)
    assert "resumed" in wrong["detail"][0]["msg"]


def test_resumed_before_the_failure_is_refused(fleet: Fleet) -> None:
    _spare_site(fleet)
    fleet.rental("GPU-1")
    failed_at = fleet.fail("GPU-1")
    [failover] = fleet.failovers()
    path = f"/v1/failovers/{failover['id']}/resumed"
    refused = fleet.console.post(path, {"resumed_at": iso(failed_at - 1)}, 422)
    assert refused["detail"][0]["loc"] == ["body", "resumed_at"]
    assert fleet.get(f"/v1/failovers/{failover['id']}")["state"] == "requested"


def test_abandoned_releases_the_spare_for_the_next_failover(fleet: Fleet) -> None:
    fleet.node("node-1")
    fleet.gpu("node-1", "GPU-1")
    fleet.gpu("node-1", "GPU-2")
    fleet.gpu("node-1", "S-1", "spare")
    fleet.rental("GPU-1")
    second = fleet.rental("GPU-2")
    fleet.fail("GPU-1")
    [first] = fleet.failovers()
    path = f"/v1/failovers/{first['id']}"
    abandoned = fleet.console.post(f"{path}/abandoned", {"reason": "job finished"}, 200)
    assert (abandoned["state"], abandoned["reason"]) == ("abandoned", "job finished")
    assert fleet.console.post(f"{path}/abandoned", {"reason": "again"}, 200) == abandoned
    refused = fleet.console.post(f"{path}/resumed", {}, 409)
    assert refused["detail"][0]["msg"].startswith(f"failover {first['id']} is abandoned")
    fleet.fail("GPU-2")
    [next_one] = fleet.failovers(rental_id=second)
    assert next_one["spare_gpu_uuid"] == "S-1"
    assert [e["data"]["reason"] for e in fleet.events("failover.abandoned")] == ["job finished"]


def test_a_reserved_spare_is_refused_to_a_new_rental(fleet: Fleet) -> None:
    fleet.node("node-1")
    fleet.gpu("node-1", "GPU-1")
    fleet.gpu("node-1", "S-1", "spare")
    fleet.rental("GPU-1")
    fleet.fail("GPU-1")
    [failover] = fleet.failovers()
    other = fleet.console.rental(fleet.customer_id, fleet.plan_id, start_at=iso(fleet.t0 + 120))
    refused = fleet.console.assign(other["id"], "S-1", iso(fleet.t0 + 120), 409)
    assert refused["detail"][0]["msg"].startswith(
        f"GPU S-1 is reserved as the spare of failover {failover['id']}"
    )


def test_an_unconfirmed_reservation_expires_and_releases_the_spare(
    fleet: Fleet, db: Engine
) -> None:
    fleet.node("node-1")
    fleet.gpu("node-1", "GPU-1")
    fleet.gpu("node-1", "S-1", "spare")
    fleet.rental("GPU-1")
    fleet.fail("GPU-1")
    [failover] = fleet.failovers()
    until = datetime.fromisoformat(failover["reserved_until"])
    with transaction(db) as session:
        # The expiry job is queued for the reservation's deadline, in the reserving transaction.
        [(task, scheduled, kwargs)] = session.execute(
            text("SELECT task_name, scheduled_at, args FROM procrastinate_jobs")
        ).all()
        assert (task, scheduled, kwargs) == (
            "failover:expire",
            until,
            {"failover_id": failover["id"]},
        )
        target = get_settings().spare_target_percent
        early = transitions.expire(session, failover["id"], until - timedelta(seconds=1), target)
        assert early is None  # not due yet
        expired = transitions.expire(session, failover["id"], until, target)
        assert expired is not None and expired.state == "expired"
    assert fleet.get(f"/v1/failovers/{failover['id']}")["state"] == "expired"
    [event] = fleet.events("failover.expired")
    assert event["data"]["spare_gpu_uuid"] == "S-1"
    other = fleet.console.rental(fleet.customer_id, fleet.plan_id, start_at=iso(fleet.t0 + 120))
    fleet.console.assign(other["id"], "S-1", iso(fleet.t0 + 120))  # free again
    fleet.console.post(f"/v1/failovers/{failover['id']}/resumed", {}, 409)


def test_unknown_failover_is_404(fleet: Fleet) -> None:
    missing = "00000000-0000-0000-0000-000000000000"
    fleet.console.post(f"/v1/failovers/{missing}/resumed", {}, 404)
    fleet.get(f"/v1/failovers/{missing}", 404)


def test_a_spare_whose_preemptible_rental_cannot_end_now_is_passed_over(fleet: Fleet) -> None:
    fleet.node("node-1")
    fleet.node("node-2")
    fleet.gpu("node-1", "GPU-1")
    fleet.gpu("node-1", "S-1", "spare")
    fleet.gpu("node-2", "S-2", "spare")
    fleet.gpu("node-2", "LATER", "spare")
    spot = fleet.console.rental(
        fleet.customer_id, fleet.plan_id, gpu_count=2, start_at=iso(fleet.t0), preemptible=True
    )["id"]
    fleet.console.assign(spot, "S-1", iso(fleet.t0))
    # The spot rental also booked a GPU for later: it cannot end now, so S-1 is not free;
    # LATER, booked for later, is not free either.
    fleet.console.assign(spot, "LATER", iso(fleet.t0 + 3600))
    fleet.rental("GPU-1")
    fleet.fail("GPU-1")
    [failover] = fleet.failovers(state="requested")
    assert (failover["spare_gpu_uuid"], failover["preempted_rental_id"]) == ("S-2", None)
    assert fleet.get(f"/v1/rentals/{spot}")["end_at"] is None
    assert fleet.events("rental.preempted") == []


def test_customers_see_only_their_own_failovers(fleet: Fleet, db: Engine) -> None:
    fleet.node("node-1")
    fleet.gpu("node-1", "GPU-1")
    fleet.rental("GPU-1")
    fleet.fail("GPU-1")
    [failover] = fleet.failovers()
    other = fleet.console.customer("Other Co")["id"]
    with transaction(db) as session:
        own = issue_key(session, KeyKind.CUSTOMER, "own", customer_id=UUID(fleet.customer_id))
        foreign = issue_key(session, KeyKind.CUSTOMER, "foreign", customer_id=UUID(other))
    own_key, foreign_key = own.secret, foreign.secret
    for key, visible in ((own_key, [failover["id"]]), (foreign_key, [])):
        listed = fleet.client.get("/v1/failovers", headers=bearer(key)).json()["items"]
        assert [f["id"] for f in listed] == visible
    path = f"/v1/failovers/{failover['id']}"
    assert fleet.client.get(path, headers=bearer(foreign_key)).status_code == 404
    assert fleet.client.post(f"{path}/resumed", json={}, headers=bearer(own_key)).status_code == 403
