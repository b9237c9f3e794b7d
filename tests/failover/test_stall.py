"""Stall credit through the service (issue 42): when a rented GPU fails, the rental's other GPUs
are credited from the failure second until the job runs again on the spare, with the failover
as evidence, on the invoice, its HTML, the incidents and the exports; another tenant's rental
is not."""

from __future__ import annotations

import csv
import io
from typing import Any

from tests.failover.conftest import Fleet, iso
from tests.failover.test_billing import _period
from tests.metering.conftest import event, rec


def _invoice(fleet: Fleet, customer_id: str) -> tuple[str, list[dict[str, Any]]]:
    body = {"period": _period(fleet.t0), "customer_id": customer_id}
    [invoice_id] = fleet.console.post("/v1/invoices/runs", body, 200)["invoice_ids"]
    return invoice_id, list(fleet.get(f"/v1/invoices/{invoice_id}")["lines"])


def _failed_job(fleet: Fleet, credit_stall: bool = True) -> tuple[str, str]:
    """Acme's 2-GPU job on GPU-1 and GPU-2; Globex's GPU-3 beside it. GPU-1 fails (XID 79) at
    t0+30, the job runs on spare S-1 from t0+50; both rentals end at t0+120. 1 cent per 10 s.
    Returns (Acme's failover, Globex's customer id)."""
    fleet.node("node-1")
    for gpu in ("GPU-1", "GPU-2", "GPU-3"):
        fleet.gpu("node-1", gpu)
    fleet.gpu("node-1", "S-1", "spare")
    if not credit_stall:
        fleet.console.client.patch(
            f"/v1/plans/{fleet.plan_id}",
            json={"credit_stall": False},
            headers=fleet.console.headers,
        ).raise_for_status()
    acme = fleet.rental("GPU-1", "GPU-2")
    acme_customer = fleet.customer_id
    globex_customer = fleet.customer_id = fleet.console.customer("Globex")["id"]
    globex = fleet.rental("GPU-3")
    fleet.customer_id = acme_customer
    t0 = fleet.t0
    xid: dict[str, Any] = {"code": 79, "detail": {"message": "GPU has fallen off the bus"}}
    change = event(
        "GPU-1", t0 + 30, "state_change", state="failed", rule="xid_79_fallen_off_bus", **xid
    )
    agent = fleet.agents["node-1"]
    agent.post(
        [rec("GPU-1", t0, t0 + 30), rec("GPU-1", t0 + 30, t0 + 60, "failed")],
        [event("GPU-1", t0 + 30, "xid", **xid), change],
    )
    [failover] = fleet.failovers(rental_id=acme)
    path = f"/v1/failovers/{failover['id']}/resumed"
    fleet.console.post(path, {"resumed_at": iso(t0 + 50)}, 200)
    agent.post(
        [
            rec("S-1", t0 + 50, t0 + 60),
            rec("S-1", t0 + 60, t0 + 120),
            *(rec(g, t0 + a, t0 + a + 60) for g in ("GPU-2", "GPU-3") for a in (0, 60)),
        ]
    )
    for rental in (acme, globex):
        fleet.console.post(f"/v1/rentals/{rental}/end", {"end_at": iso(t0 + 120)}, 200)
    return failover["id"], globex_customer


def _kinds(lines: list[dict[str, Any]]) -> dict[str, list[tuple[Any, ...]]]:
    out: dict[str, list[tuple[Any, ...]]] = {}
    for line in lines:
        out.setdefault(line["kind"], []).append((line["gpu_uuid"], line["seconds"], line["amount"]))
    return out


def test_the_other_gpu_of_a_failed_job_is_credited_until_it_resumes(fleet: Fleet) -> None:
    failover_id, _ = _failed_job(fleet)
    t0 = fleet.t0
    invoice_id, lines = _invoice(fleet, fleet.customer_id)
    kinds = _kinds(lines)
    # 240 GPU-seconds: GPU-1's 20-s migration window, and GPU-2's 20 s waiting for it.
    assert kinds["charge"] == [(None, 240, "0.24")]
    assert kinds["migration_credit"] == [("GPU-1", 20, "-0.02")]
    assert kinds["stall_credit"] == [("GPU-2", 20, "-0.02")]
    stall = next(line for line in lines if line["kind"] == "stall_credit")
    assert (stall["start_at"], stall["end_at"]) == (iso(t0 + 30), iso(t0 + 50))
    assert stall["evidence"]["stalled_by"] == "GPU-1"
    assert stall["evidence"]["reason"] == f"failover {failover_id}"
    html = fleet.client.get(f"/v1/invoices/{invoice_id}/html", headers=fleet.console.headers).text
    assert "Stalled-job credit" in html
    # 40 GPU-seconds credited, for one incident: GPU-1's (GPU-2's wait is part of it).
    assert "0.01 GPU-hours credited for 1 incident" in html
    assert f"job stalled by GPU-1: migrated from GPU-1 to S-1: failover {failover_id}" in html

    [incident] = fleet.get(f"/v1/customers/{fleet.customer_id}/incidents?period={_period(t0)}")[
        "items"
    ]
    assert (incident["gpu_uuid"], incident["credited"], incident["credited_s"]) == (
        "GPU-1",
        "0.02",
        20,
    )
    assert (incident["stall_credited"], incident["stall_credited_s"]) == ("0.02", 20)
    assert "other GPUs while the job waited" in incident["summary"]

    path = f"/v1/customers/{fleet.customer_id}/exports/focus.csv?period={_period(t0)}"
    rows = list(
        csv.DictReader(io.StringIO(fleet.client.get(path, headers=fleet.console.headers).text))
    )
    stalled = [r for r in rows if "waited on another GPU" in r["ChargeDescription"]]
    assert [(r["ChargeCategory"], r["BilledCost"]) for r in stalled] == [("Credit", "-0.02")]


def test_a_plan_without_stall_credit_bills_the_waiting_gpu(fleet: Fleet) -> None:
    _failed_job(fleet, credit_stall=False)
    kinds = _kinds(_invoice(fleet, fleet.customer_id)[1])
    assert kinds["charge"] == [(None, 240, "0.24")]
    assert kinds["migration_credit"] == [("GPU-1", 20, "-0.02")]
    assert "stall_credit" not in kinds


def test_another_tenants_rental_is_not_stalled(fleet: Fleet) -> None:
    _, globex = _failed_job(fleet)
    kinds = _kinds(_invoice(fleet, globex)[1])
    assert kinds["charge"] == [(None, 120, "0.12")]
    assert set(kinds) == {"charge", "tax"}  # no credit of any kind
