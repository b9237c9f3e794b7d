"""What the failure loop bills, to the second and the cent: a failure with no spare is credited
as failure until repair; a preemptible rental a failover preempts ends at that second."""

from __future__ import annotations

from datetime import datetime
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from app.core.epoch import from_epoch
from metering_agent.protocol import MINUTE
from tests.failover.conftest import PREEMPTIBLE_PRICE, PRICE, Fleet, iso
from tests.harness import bearer


def _period(second: int) -> str:
    return from_epoch(second).strftime("%Y-%m")


def _invoice_lines(fleet: Fleet, customer_id: str, period: str) -> list[dict[str, Any]]:
    body = {"period": period, "customer_id": customer_id}
    [invoice_id] = fleet.console.post("/v1/invoices/runs", body, 200)["invoice_ids"]
    return list(fleet.get(f"/v1/invoices/{invoice_id}")["lines"])


def _cents(seconds: int, price: str) -> str:
    amount = Decimal(seconds) * Decimal(price) / 3600
    return str(amount.quantize(Decimal("0.01"), rounding=ROUND_HALF_UP))


def _healthy(fleet: Fleet, gpu: str, start: int, end: int) -> None:
    """Healthy telemetry of [start, end), one record per UTC minute (as the agent cuts them)."""
    runs, at = [], start
    while at < end:
        until = min(end, at - at % MINUTE + MINUTE)
        runs.append((at, until, "healthy"))
        at = until
    fleet.report(gpu, runs)


def test_no_spare_leaves_the_rental_credited_as_failure_until_repair(fleet: Fleet) -> None:
    fleet.node("node-1")
    fleet.gpu("node-1", "GPU-1")
    rental = fleet.rental("GPU-1")
    t0 = fleet.t0
    fleet.report("GPU-1", [(t0, t0 + 60, "healthy"), (t0 + 60, t0 + 120, "failed")])
    [failover] = fleet.failovers()
    assert (failover["state"], failover["spare_gpu_uuid"]) == ("no_spare", None)
    [event] = fleet.events("failover.no_spare")
    assert event["data"]["spare_gpu_uuid"] is None
    assert event["data"]["credited_as"] == "failure"
    assert event["data"]["reason"] == (
        f"no free H100 spare in fra1: the rental is credited as failure from "
        f"{from_epoch(t0 + 60).isoformat()} until the GPU is repaired"
    )
    fleet.report("GPU-1", [(t0 + 120, t0 + 180, "healthy")])  # repaired
    assert fleet.get(f"/v1/failovers/{failover['id']}")["state"] == "recovered"
    assert [e["data"]["failover_id"] for e in fleet.events("failover.recovered")] == [
        failover["id"]
    ]
    fleet.console.post(f"/v1/rentals/{rental}/end", {"end_at": iso(t0 + 180)}, 200)

    lines = _invoice_lines(fleet, fleet.customer_id, _period(t0))
    by_kind = {line["kind"]: (line["seconds"], line["amount"]) for line in lines}
    # 180 rented seconds: 120 billed, the 60 failed ones credited, 1 cent per 10 s.
    assert by_kind["charge"] == (180, _cents(180, PRICE)) == (180, "0.18")
    assert by_kind["failure_credit"] == (60, "-0.06")


def test_a_failover_preempts_a_preemptible_spare_billed_to_that_second(fleet: Fleet) -> None:
    fleet.node("node-1")
    fleet.gpu("node-1", "GPU-1")
    fleet.gpu("node-1", "S-1", "spare")
    spot = fleet.console.customer("Spot Co")["id"]
    owner, fleet.customer_id = fleet.customer_id, spot
    preemptible = fleet.rental("S-1", preemptible=True)
    fleet.customer_id = owner
    fleet.rental("GPU-1")
    pool = fleet.get("/v1/spare-pool")["pools"][0]
    assert (pool["available"], pool["preemptibly_rented"]) == (1, 1)  # still a spare

    fleet.fail("GPU-1")
    [failover] = fleet.failovers()
    assert failover["spare_gpu_uuid"] == "S-1"
    assert failover["preempted_rental_id"] == preemptible
    ended = fleet.get(f"/v1/rentals/{preemptible}")
    preempted_at = int(datetime.fromisoformat(ended["preempted_at"]).timestamp())
    assert ended["end_at"] == ended["preempted_at"]
    assert [a["end_at"] for a in ended["assignments"]] == [ended["preempted_at"]]
    [event] = fleet.events("rental.preempted")
    assert event["customer_id"] == spot
    assert event["data"] == {
        "rental_id": preemptible,
        "customer_id": spot,
        "gpu_uuids": ["S-1"],
        "preempted_at": from_epoch(preempted_at).isoformat(),
        "reason": "its GPU S-1 was taken as the hot spare of a failed GPU",
    }  # nothing of the other tenant's failover
    # S-1 ran healthy for the spot customer up to the preemption second.
    _healthy(fleet, "S-1", fleet.t0, preempted_at + 1)

    lines = _invoice_lines(fleet, spot, _period(fleet.t0))
    rented = preempted_at - fleet.t0
    # Rated at the preemptible price, never past the preemption second, and no credit.
    assert [(line["kind"], line["seconds"], line["amount"]) for line in lines] == [
        ("charge", rented, _cents(rented, PREEMPTIBLE_PRICE)),
        ("tax", None, "0.00"),
    ]
    assert Decimal(lines[0]["rate"]) == Decimal(PREEMPTIBLE_PRICE)
    sold = fleet.get("/v1/spare-pool")["pools"][0]
    assert sold["preemptible_gpu_seconds"] == rented
    assert (sold["available"], sold["reserved"]) == (0, 1)
    # Once the job resumes on S-1 it leaves the spare pool; the hours sold before stay counted.
    resumed = {"resumed_at": iso(preempted_at + 5)}
    fleet.console.post(f"/v1/failovers/{failover['id']}/resumed", resumed, 200)
    after = fleet.get("/v1/spare-pool")["pools"][0]
    assert (after["spare_gpus"], after["preemptible_gpu_seconds"]) == (0, rented)


def test_a_failovers_customer_never_sees_the_preempted_tenants_rental_id(fleet: Fleet) -> None:
    fleet.node("node-1")
    fleet.gpu("node-1", "GPU-1")
    fleet.gpu("node-1", "GPU-2")
    fleet.gpu("node-1", "S-1", "spare")
    spot = fleet.console.customer("Spot Co")["id"]
    owner, fleet.customer_id = fleet.customer_id, spot
    preemptible = fleet.rental("S-1", preemptible=True)
    fleet.customer_id = owner
    rental = fleet.rental("GPU-1", "GPU-2")
    fleet.fail("GPU-1")
    [failover] = fleet.failovers()
    assert failover["preempted_rental_id"] == preemptible  # the admin sees which rental

    def as_customer(customer_id: str) -> dict[str, str]:
        body = {"name": "console"}
        return bearer(fleet.console.post(f"/v1/customers/{customer_id}/keys", body)["key"])

    mine = as_customer(owner)

    def read(path: str, headers: dict[str, str]) -> str:
        response = fleet.client.get(path, headers=headers)
        assert response.status_code == 200, (path, response.text)
        return response.text

    period = _period(fleet.t0)
    for path in (
        "/v1/failovers",
        f"/v1/failovers?rental_id={rental}",
        "/v1/events?limit=500",
        f"/v1/customers/{owner}/incidents?period={period}",
        f"/dashboard/incidents?period={period}",
    ):
        assert preemptible not in read(path, mine), path
    one = fleet.client.get(f"/v1/failovers/{failover['id']}", headers=mine).json()
    assert (one["rental_id"], one["spare_preempted"], one["preempted_rental_id"]) == (
        rental,
        True,
        None,
    )
    [listed] = fleet.client.get("/v1/failovers", headers=mine).json()["items"]
    assert (listed["spare_preempted"], listed["preempted_rental_id"]) == (True, None)
    [requested] = [
        e
        for e in fleet.client.get("/v1/events?limit=500", headers=mine).json()["items"]
        if e["type"] == "failover.requested"
    ]
    assert requested["data"]["spare_preempted"] is True
    assert requested["data"]["preempted_rental_id"] is None
    # The preempted tenant learns of its own rental's end, and nothing of the failover's rental.
    theirs = as_customer(spot)
    assert fleet.client.get(f"/v1/failovers/{failover['id']}", headers=theirs).status_code == 404
    assert rental not in read("/v1/events?limit=500", theirs)
