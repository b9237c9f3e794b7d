"""The adapter's least privilege: a scheduler key posts snapshots, reads and completes its
cluster's actions and reports their failovers' outcomes (resumed, abandoned), and can do
nothing else: no account mappings, customers, prices, invoices, keys or other failovers."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest

from app.core.epoch import from_epoch
from tests.harness import bearer
from tests.slurm.conftest import ACCOUNT, CLUSTER, SlurmWorld, job
from tests.slurm.test_actions import TWO_NODES, _fail


@pytest.fixture
def scheduler(world: SlurmWorld) -> dict[str, str]:
    issued = world.console.post("/v1/keys/scheduler", {"name": "gpumeter-slurm on hpc-ctl"})
    assert issued["kind"] == "scheduler"
    return bearer(issued["key"])


def _call(world: SlurmWorld, key: dict[str, str], method: str, path: str, body: Any = None) -> Any:
    return world.client.request(method, path, json=body, headers=key)


def test_a_scheduler_key_carries_out_a_failover_and_reports_its_outcome(
    world: SlurmWorld, scheduler: dict[str, str]
) -> None:
    t0 = world.t0
    snapshot = {"cluster": CLUSTER, "taken_at": t0 + 1,
                "jobs": [job(7, "RUNNING", start=t0, nodes=TWO_NODES)]}  # fmt: skip
    answer = _call(world, scheduler, "POST", "/v1/slurm/snapshots", snapshot)
    assert answer.status_code == 200 and answer.json()["attributed"] == 1
    _fail(world, t0 + 30)
    listed = _call(world, scheduler, "GET", f"/v1/slurm/actions?cluster={CLUSTER}")
    [action] = listed.json()["items"]
    assert _call(world, scheduler, "GET", "/v1/slurm/layout").status_code == 200
    body = {"resumed_at": from_epoch(t0 + 44).isoformat()}
    path = f"/v1/slurm/actions/{action['id']}/resumed"
    done = _call(world, scheduler, "POST", path, body)
    assert done.status_code == 200, done.text
    assert done.json()["done_at"] is not None
    assert done.json()["outcome"].startswith("job 7 runs on n3 since")
    [failover] = world.get("/v1/failovers")["items"]
    assert failover["state"] == "resumed"
    assert datetime.fromisoformat(failover["resumed_at"]) == from_epoch(t0 + 44)
    again = _call(world, scheduler, "POST", path, body)  # a retry changes nothing
    assert again.json()["done_at"] == done.json()["done_at"]
    abandon = {"reason": "too late"}
    late = _call(world, scheduler, "POST", f"/v1/slurm/actions/{action['id']}/abandoned", abandon)
    assert late.status_code == 200 and late.json()["outcome"] == done.json()["outcome"]


def test_a_scheduler_key_abandons_a_failover_with_its_reason(
    world: SlurmWorld, scheduler: dict[str, str]
) -> None:
    t0 = world.t0
    world.snapshot(job(7, "RUNNING", start=t0, nodes=TWO_NODES), at=t0 + 1)
    _fail(world, t0 + 30)
    [action] = world.get(f"/v1/slurm/actions?cluster={CLUSTER}")["items"]
    reason = {"reason": "job 7 is no longer running in Slurm"}
    path = f"/v1/slurm/actions/{action['id']}/abandoned"
    done = _call(world, scheduler, "POST", path, reason)
    assert done.status_code == 200, done.text
    assert done.json()["outcome"] == "abandoned: job 7 is no longer running in Slurm"
    [failover] = world.get("/v1/failovers")["items"]
    assert (failover["state"], failover["reason"]) == ("abandoned", reason["reason"])


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("PUT", f"/v1/slurm/accounts/{ACCOUNT}", {"customer_id": "", "plan_id": ""}),
        ("GET", "/v1/slurm/accounts", None),
        ("GET", "/v1/slurm/jobs", None),
        ("GET", "/v1/customers", None),
        ("POST", "/v1/customers", {"name": "Mallory", "currency": "USD"}),
        ("GET", "/v1/invoices", None),
        ("GET", "/v1/failovers", None),
        ("POST", "/v1/failovers/00000000-0000-0000-0000-000000000001/resumed", {}),
        ("POST", "/v1/keys", {"name": "escalate"}),
        ("POST", "/v1/keys/scheduler", {"name": "another"}),
        ("GET", "/v1/gpus", None),
        ("POST", "/v1/plans", {"name": "free", "prices": []}),
    ],
)
def test_a_scheduler_key_can_do_nothing_else(
    world: SlurmWorld, scheduler: dict[str, str], method: str, path: str, body: Any
) -> None:
    answer = _call(world, scheduler, method, path, body)
    assert answer.status_code == 403, answer.text
    assert "needs a" in answer.json()["detail"] or "admin" in answer.text
