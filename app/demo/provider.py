"""The demo provider, created through the console API as an operator would create it.

Two nodes of four simulated H100s (the agents' UUID scheme, so the live agents report these
GPUs), one spare (after the backfill, whichever GPUs no rental holds); three customers on a
plan with long-rental voucher tiers and a monthly cap; rentals that began last month, so last
month's invoices have content and vouchers; a monthly budget for Acme AI.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from app.core.console_client import Api
from app.simulate.fleet import PLAN_TERMS, plan_prices
from metering_agent.nvml.simulated import DEFAULT_MODEL, sim_uuid

GPUS_PER_NODE = 4


@dataclass
class DemoNode:
    id: str
    hostname: str
    token: str
    gpus: list[str]


@dataclass
class Provider:
    plan_id: str
    nodes: list[DemoNode]
    customers: dict[str, str]  # name -> id
    rentals: dict[str, str] = field(default_factory=dict)  # customer name -> rental id

    @property
    def gpus(self) -> list[str]:
        return [g for n in self.nodes for g in n.gpus]

    def locate(self, gpu: str) -> tuple[DemoNode, int]:
        node = next(n for n in self.nodes if gpu in n.gpus)
        return node, node.gpus.index(gpu)


def create_provider(api: Api, tag: str, month_start: datetime) -> Provider:
    plan = api.post(
        "/v1/plans",
        {
            "name": f"demo-{tag} on-demand",
            "prices": [p for p in plan_prices(0) if p["gpu_model"] == DEFAULT_MODEL],
            **PLAN_TERMS,
        },
    )
    nodes = [_node(api, f"demo-{tag}-{name}") for name in ("a", "b")]
    spare = nodes[1].gpus[-1]
    api.call("PATCH", f"/v1/gpus/{spare}", {"pool": "spare"})
    customers = {
        name: api.post("/v1/customers", {"name": name, "email": email})["id"]
        for name, email in (
            ("Acme AI", "billing@acme.example"),
            ("Globex Research", "ap@globex.example"),
            ("Initech Labs", "finance@initech.example"),
        )
    }
    provider = Provider(plan["id"], nodes, customers)
    a, b = nodes[0].gpus, nodes[1].gpus
    # Acme: a long rental (both voucher tiers); Globex: from the 10th; Initech: ended.
    _rent(api, provider, "Acme AI", a, month_start - timedelta(days=20), None)
    _rent(api, provider, "Globex Research", b[:2], month_start + timedelta(days=9), None)
    end = month_start + timedelta(days=25)
    _rent(api, provider, "Initech Labs", b[2:3], month_start + timedelta(days=12), end)
    # Acme's finance team watches its month: 4 GPUs capped at 1,500.00 each cost about 6,000.
    budget = {
        "amount": "6500.00",
        "thresholds": [
            {"percent": 50, "basis": "actual"},
            {"percent": 80, "basis": "actual"},
            {"percent": 100, "basis": "actual"},
            {"percent": 90, "basis": "forecast"},
        ],
    }
    api.post(f"/v1/customers/{customers['Acme AI']}/budgets", budget)
    return provider


def _node(api: Api, hostname: str) -> DemoNode:
    created = api.post("/v1/nodes", {"hostname": hostname, "datacenter": "demo-1"})
    node_id = created["node"]["id"]
    gpus = [sim_uuid(hostname, i) for i in range(GPUS_PER_NODE)]
    for gpu in gpus:
        api.post("/v1/gpus", {"uuid": gpu, "node_id": node_id, "model": DEFAULT_MODEL})
    return DemoNode(node_id, hostname, created["token"]["key"], gpus)


def _rent(
    api: Api,
    provider: Provider,
    customer: str,
    gpus: list[str],
    start: datetime,
    end: datetime | None,
) -> None:
    rental = api.post(
        "/v1/rentals",
        {
            "customer_id": provider.customers[customer],
            "plan_id": provider.plan_id,
            "gpu_model": DEFAULT_MODEL,
            "gpu_count": len(gpus),
            "start_at": start.isoformat(),
            "end_at": None if end is None else end.isoformat(),
        },
    )
    for gpu in gpus:
        assignment = {"gpu_uuid": gpu, "start_at": start.isoformat()}
        api.post(f"/v1/rentals/{rental['id']}/assignments", assignment)
    provider.rentals[customer] = rental["id"]


def pool_idle_gpus(api: Api, provider: Provider) -> list[str]:
    """Put every GPU no rental holds now into the spare pool, so the live failure has a spare:
    the backfill's migrations may have moved a rental onto the first one (a repaired GPU
    returns to the pool, as a provider's policy would have it). The spares, in order."""
    held = {
        a["gpu_uuid"]
        for rental in api.get("/v1/rentals", limit=100)["items"]
        for a in rental["assignments"]
        if a["end_at"] is None
    }
    idle = [gpu for gpu in provider.gpus if gpu not in held]
    for gpu in idle:
        api.call("PATCH", f"/v1/gpus/{gpu}", {"pool": "spare"})
    return idle
