"""A Slurm job's failover becomes the adapter's actions: drain the failed node with the
evidence as its reason and requeue the job onto the spare's node; the job's snapshots wait
until the failover is resumed; the spare's whole node serves the job; the repaired node is
resumed and becomes the spare."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest

from app.core.epoch import epoch, from_epoch
from tests.slurm.conftest import CLUSTER, SlurmWorld, gpu_of, job

TWO_NODES = {"n1": [0, 1], "n2": [0, 1]}


def _actions(world: SlurmWorld) -> list[dict[str, Any]]:
    return list(world.get(f"/v1/slurm/actions?cluster={CLUSTER}")["items"])


def _pools(world: SlurmWorld, node: str) -> list[str]:
    return [world.get(f"/v1/gpus/{gpu_of(node, i)}")["pool"] for i in (0, 1)]


def _fail(world: SlurmWorld, at: int) -> None:
    """n1's GPU 0 falls off the bus (XID 79) at ``at``."""
    event = {"event_id": f"xid-{at}", "gpu_uuid": gpu_of("n1", 0), "at": at, "kind": "xid",
             "code": 79, "rule": "xid_79_fallen_off_bus"}  # fmt: skip
    records = [
        {"gpu_uuid": gpu_of("n1", 0), "model": "H100", "start": a, "end": b, "state": s,
         "sample_count": b - a, "device_index": 0}
        for a, b, s in ((world.t0, at, "healthy"), (at, world.t0 + 60, "failed"))
    ]  # fmt: skip
    world.agents["n1"].post(records, [event])


def test_a_failover_of_a_slurm_job_is_carried_out_through_actions(world: SlurmWorld) -> None:
    t0 = world.t0
    world.snapshot(job(7, "RUNNING", start=t0, nodes=TWO_NODES), at=t0 + 1)
    _fail(world, t0 + 30)
    [failover] = world.get("/v1/failovers")["items"]
    assert failover["state"] == "requested" and failover["spare_gpu_uuid"].startswith("GPU-n3")
    [action] = _actions(world)
    assert (action["kind"], action["node"], action["spare_node"], action["job_id"]) == (
        "failover", "n1", "n3", 7,
    )  # fmt: skip
    assert action["nodes_after"] == ["n2", "n3"] and action["restarts_before"] == 0
    assert action["reason"] == (
        f"gpumeter: GPU 0 ({gpu_of('n1', 0)}) xid 79 xid_79_fallen_off_bus; "
        f"failover {failover['id']}"
    )
    # Slurm requeued the job (at +40) and runs it on n2 + n3 from +44: until the adapter says
    # resumed, the job's snapshots change nothing.
    rerun = job(7, "RUNNING", start=t0 + 44, restarts=1, submit=t0 + 40,
                nodes={"n2": [0, 1], "n3": [0, 1]})  # fmt: skip
    assert world.snapshot(rerun, at=t0 + 45)["deferred"] == 1
    body = {"resumed_at": _iso(t0 + 44)}
    resumed = world.console.post(f"/v1/failovers/{failover['id']}/resumed", body, 200)
    assert resumed["state"] == "resumed"
    assert _pools(world, "n3") == ["rentable", "rentable"]  # the spare's node serves the job
    assert world.snapshot(rerun, at=t0 + 46)["attributed"] == 1
    spare = failover["spare_gpu_uuid"]
    other = gpu_of("n3", 1 - int(spare[-1]))
    assert world.assignments(7) == sorted([
        (gpu_of("n1", 0), t0, t0 + 30),  # the failed GPU, to its first failed second
        (gpu_of("n1", 1), t0, t0 + 40),  # the rest of the first run, to the requeue
        (gpu_of("n2", 0), t0, t0 + 40),
        (gpu_of("n2", 1), t0, t0 + 40),
        (spare, t0 + 44, None),  # the migration's, from the resumption
        (other, t0 + 44, None),
        (gpu_of("n2", 0), t0 + 44, None),
        (gpu_of("n2", 1), t0 + 44, None),
    ])  # fmt: skip
    [migration] = world.get(f"/v1/rentals/{world.job_row(7)['rental_id']}")["migrations"]
    assert (_epoch(migration["failed_at"]), _epoch(migration["resumed_at"])) == (t0 + 30, t0 + 44)
    done = world.console.post(f"/v1/slurm/actions/{action['id']}/done", {"outcome": "ok"}, 200)
    assert done["done_at"] is not None and _actions(world) == []
    assert world.get("/v1/slurm/layout")["drained_nodes"] == ["n1"]  # until its repair

    # The GPU is reset and healthy: n1 is resumed, and (its site short of spares) becomes one.
    world.report("n1", [(0, t0 + 60, t0 + 61, "healthy")])
    [repair] = _actions(world)
    assert (repair["kind"], repair["node"]) == ("repair", "n1")
    assert _pools(world, "n1") == ["spare", "spare"]
    layout = world.get("/v1/slurm/layout")
    assert layout == {"spare_nodes": ["n1"], "worker_nodes": ["n2", "n3"], "drained_nodes": []}
    world.report("n1", [(0, t0 + 61, t0 + 62, "failed"), (0, t0 + 62, t0 + 63, "healthy")])
    assert [a["id"] for a in _actions(world)] == [repair["id"]]  # one open repair per node


def test_a_failover_of_a_rental_slurm_does_not_run_asks_nothing_of_it(world: SlurmWorld) -> None:
    rental = world.console.rental(world.customer_id, world.plan_id, start_at=_iso(world.t0))
    world.console.assign(rental["id"], gpu_of("n1", 0), _iso(world.t0))
    _fail(world, world.t0 + 30)
    assert world.get("/v1/failovers")["items"][0]["state"] == "requested"
    assert _actions(world) == []


@pytest.mark.parametrize(
    ("flags", "reason"),
    [
        ({"requeue": False}, "job 7 was submitted with --no-requeue: Slurm cannot requeue it"),
        ({"batch": False}, "job 7 is interactive (salloc/srun): Slurm cannot requeue it"),
    ],
)
def test_a_job_slurm_cannot_requeue_is_abandoned_with_the_reason_and_holds_no_spare(
    world: SlurmWorld, flags: dict[str, bool], reason: str
) -> None:
    """Beside a requeueable job (8) whose failover goes ahead, job 7 cannot be requeued: its
    failover is abandoned, saying why, before any spare is reserved: the spare node's
    preemptible rental runs on, the adapter is asked nothing for it and the spare stays free
    for the next failure."""
    t0 = world.t0
    preemptible = _preemptible_rental_on_spares(world)
    world.snapshot(
        job(7, "RUNNING", start=t0, nodes={"n1": [0]}) | flags,
        job(8, "RUNNING", start=t0, nodes={"n2": [0, 1]}),
        at=t0 + 1,
    )
    assert world.job_row(7)["requeue_refusal"] == reason
    _fail(world, t0 + 30)
    [abandoned] = world.get("/v1/failovers")["items"]
    assert (abandoned["state"], abandoned["reason"]) == ("abandoned", reason)
    assert (abandoned["spare_gpu_uuid"], abandoned["preempted_rental_id"]) == (None, None)
    assert world.events("failover.requested") == []
    assert [e["data"]["failover_id"] for e in world.events("failover.abandoned")] == [
        abandoned["id"]
    ]
    assert world.events("rental.preempted") == []
    assert world.get(f"/v1/rentals/{preemptible}")["end_at"] is None
    assert _actions(world) == []
    assert _pools(world, "n3") == ["spare", "spare"]
    world.report("n2", [(0, t0 + 40, t0 + 41, "failed")])
    [_, requested] = world.get("/v1/failovers?limit=10")["items"]
    assert requested["state"] == "requested" and requested["spare_gpu_uuid"].startswith("GPU-n3")
    assert requested["preempted_rental_id"] == preemptible  # this one did need the spare
    [action] = _actions(world)
    assert (action["job_id"], action["node"]) == (8, "n2")


def _preemptible_rental_on_spares(world: SlurmWorld) -> str:
    """Both of n3's spare GPUs rented preemptibly by another customer since t0 - 60."""
    prices = [{"gpu_model": "H100", "price_per_hour": "36.00", "preemptible_price_per_hour":
               "18.00", "effective_from": "2026-01-01T00:00:00Z"}]  # fmt: skip
    plan = world.console.post("/v1/plans", {"name": "spot", "prices": prices})["id"]
    customer = world.console.customer("Beta Lab")["id"]
    since = _iso(world.t0 - 60)
    rental = world.console.rental(customer, plan, gpu_count=2, start_at=since, preemptible=True)
    for i in (0, 1):
        world.console.assign(rental["id"], gpu_of("n3", i), since)
    return str(rental["id"])


def _iso(second: int) -> str:
    return from_epoch(second).isoformat()


def _epoch(moment: str) -> int:
    return epoch(datetime.fromisoformat(moment))
