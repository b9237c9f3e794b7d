"""A fleet a Slurm cluster runs on: nodes n1, n2 (workers) and n3 (the hot spare), two H100s
each, whose agents report their GPUs' device indices; an account mapped to Acme AI."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.harness import Console
from tests.metering.conftest import Agent, minute_ago, rec

PRICE = "36.00"  # one cent a second
CLUSTER = "hpc"
ACCOUNT = "acme-ml"


def gpu_of(node: str, index: int) -> str:
    return f"GPU-{node}-{index}"


@dataclass
class SlurmWorld:
    console: Console
    client: TestClient
    customer_id: str = ""
    plan_id: str = ""
    t0: int = field(default_factory=lambda: minute_ago(10))
    agents: dict[str, Agent] = field(default_factory=dict)

    def node(
        self, hostname: str, pool: str = "rentable", gpus: int = 2, *, report: bool = True
    ) -> None:
        """Register the node and its GPUs; its agent reports them unless ``report`` is False
        (they have no device index yet)."""
        registered = self.console.post(
            "/v1/nodes", {"hostname": hostname, "datacenter": "fra1", "topology_group": "nvl-a"}
        )
        self.agents[hostname] = Agent(
            self.client, registered["node"]["id"], registered["token"]["key"]
        )
        for i in range(gpus):
            body = {"uuid": gpu_of(hostname, i), "node_id": registered["node"]["id"],
                    "model": "H100", "pool": pool}  # fmt: skip
            self.console.post("/v1/gpus", body)
        if report:
            self.report(hostname, [(i, self.t0 - 60, self.t0 - 30, "healthy") for i in range(gpus)])

    def report(self, hostname: str, runs: list[tuple[int, int, int, str]]) -> None:
        """The node's agent reports (device index, start, end, state) runs."""
        records = [rec(gpu_of(hostname, i), a, b, s, device_index=i) for i, a, b, s in runs]
        self.agents[hostname].post(records)

    def map_account(self, account: str) -> None:
        """Bill the Slurm account's jobs to Acme AI on the per-second plan."""
        mapping = {"customer_id": self.customer_id, "plan_id": self.plan_id}
        response = self.client.put(
            f"/v1/slurm/accounts/{account}", json=mapping, headers=self.console.headers
        )
        assert response.status_code == 200, response.text

    def snapshot(self, *jobs: dict[str, Any], at: int, status: int = 200, **fields: Any) -> Any:
        body = {"cluster": CLUSTER, "taken_at": at, "jobs": list(jobs), **fields}
        response = self.client.post("/v1/slurm/snapshots", json=body, headers=self.console.headers)
        assert response.status_code == status, response.text
        return response.json()

    def get(self, path: str, status: int = 200) -> Any:
        response = self.client.get(path, headers=self.console.headers)
        assert response.status_code == status, response.text
        return response.json()

    def job_row(self, job_id: int) -> dict[str, Any]:
        [row] = [j for j in self.get("/v1/slurm/jobs?limit=1000")["items"] if j["job_id"] == job_id]
        return row

    def assignments(self, job_id: int) -> list[tuple[str, int | None, int | None]]:
        """(GPU, start, end) of the job's rental, in order."""
        rental = self.get(f"/v1/rentals/{self.job_row(job_id)['rental_id']}")
        return sorted(
            (a["gpu_uuid"], _epoch(a["start_at"]), _epoch(a["end_at"]))
            for a in rental["assignments"]
        )

    def events(self, event_type: str) -> list[dict[str, Any]]:
        return list(self.get(f"/v1/events?limit=1000&type={event_type}")["items"])


def _epoch(moment: str | None) -> int | None:
    return None if moment is None else int(datetime.fromisoformat(moment).timestamp())


def job(
    job_id: int,
    state: str,
    *,
    start: int | None,
    nodes: dict[str, list[int]] | None = None,
    restarts: int = 0,
    submit: int | None = None,
    end: int | None = None,
    account: str = ACCOUNT,
) -> dict[str, Any]:
    """One job as the adapter reports it from squeue --json."""
    return {
        "job_id": job_id,
        "account": account,
        "state": state,
        "restarts": restarts,
        "submit_time": submit if submit is not None else (start or 0) - 1,
        "start_time": start,
        "end_time": end,
        "allocation": [{"node": n, "gpu_indices": ix} for n, ix in (nodes or {}).items()],
    }


@pytest.fixture
def world(console: Console, client: TestClient) -> SlurmWorld:
    world = SlurmWorld(console, client)
    world.customer_id = console.customer("Acme AI")["id"]
    prices = [{"gpu_model": "H100", "price_per_hour": PRICE,
               "effective_from": "2026-01-01T00:00:00Z"}]  # fmt: skip
    world.plan_id = console.post("/v1/plans", {"name": "per second", "prices": prices})["id"]
    for hostname in ("n1", "n2"):
        world.node(hostname)
    world.node("n3", pool="spare")
    world.map_account(ACCOUNT)
    return world
