"""A small fleet for failover tests: nodes in datacenters and topology groups, GPUs in pools,
a plan with a preemptible price, rentals, and agents that report through real ingest."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.core.epoch import from_epoch
from tests.harness import Console
from tests.metering.conftest import Agent, minute_ago, rec

PRICE = "3.60"  # 1 cent per 10 s
PREEMPTIBLE_PRICE = "1.80"  # 1 cent per 20 s


def iso(second: int) -> str:
    return from_epoch(second).isoformat().replace("+00:00", "Z")


@dataclass
class Fleet:
    console: Console
    client: TestClient
    t0: int = field(default_factory=lambda: minute_ago(10))  # rentals begin here
    agents: dict[str, Agent] = field(default_factory=dict)
    node_of: dict[str, str] = field(default_factory=dict)
    plan_id: str = ""
    customer_id: str = ""

    def node(self, hostname: str, datacenter: str = "fra1", group: str | None = "nvl-a") -> Agent:
        registered = self.console.post(
            "/v1/nodes", {"hostname": hostname, "datacenter": datacenter, "topology_group": group}
        )
        agent = Agent(self.client, registered["node"]["id"], registered["token"]["key"])
        self.agents[hostname] = agent
        return agent

    def gpu(self, hostname: str, uuid: str, pool: str = "rentable", model: str = "H100") -> str:
        body = {"uuid": uuid, "node_id": self.agents[hostname].node_id, "model": model}
        self.console.post("/v1/gpus", {**body, "pool": pool})
        self.node_of[uuid] = hostname
        return uuid

    def rental(self, *gpus: str, preemptible: bool = False, start: int | None = None) -> str:
        begin = self.t0 if start is None else start
        rental = self.console.rental(
            self.customer_id,
            self.plan_id,
            gpu_count=len(gpus),
            start_at=iso(begin),
            preemptible=preemptible,
        )
        for gpu in gpus:
            self.console.assign(rental["id"], gpu, iso(begin))
        return str(rental["id"])

    def report(self, gpu: str, runs: list[tuple[int, int, str]]) -> None:
        """The GPU's agent reports these (start, end, state) runs (each within one minute)."""
        agent = self.agents[self.node_of[gpu]]
        agent.post([rec(gpu, a, b, state) for a, b, state in runs])

    def fail(self, *gpus: str, at: int | None = None) -> int:
        """Each GPU healthy from t0, failed from ``at`` (default t0 + 30) to the minute's end,
        reported by its agent; returns the first failed second."""
        failed_at = self.t0 + 30 if at is None else at
        for gpu in gpus:
            self.report(gpu, [(self.t0, failed_at, "healthy"), (failed_at, self.t0 + 60, "failed")])
        return failed_at

    def get(self, path: str, status: int = 200) -> Any:
        response = self.client.get(path, headers=self.console.headers)
        assert response.status_code == status, response.text
        return response.json()

    def events(self, *types: str) -> list[dict[str, Any]]:
        query = "&".join(f"type={t}" for t in types)
        return list(self.get(f"/v1/events?limit=1000&{query}")["items"])

    def failovers(self, **filters: str) -> list[dict[str, Any]]:
        query = "&".join(f"{k}={v}" for k, v in filters.items())
        return list(self.get(f"/v1/failovers?limit=1000&{query}")["items"])


@pytest.fixture
def fleet(console: Console, client: TestClient) -> Fleet:
    fleet = Fleet(console, client)
    fleet.customer_id = console.customer("Acme AI")["id"]
    prices = [
        {
            "gpu_model": model,
            "price_per_hour": PRICE,
            "preemptible_price_per_hour": PREEMPTIBLE_PRICE,
            "effective_from": "2026-01-01T00:00:00Z",
        }
        for model in ("H100", "A100")
    ]
    fleet.plan_id = console.post("/v1/plans", {"name": "on-demand", "prices": prices})["id"]
    return fleet
