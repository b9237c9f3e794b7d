"""A synthetic provider for ``gpumeter simulate``: nodes of 8 GPUs, customers, a plan, rentals.

Plans and customers go through their services; nodes, GPUs, rentals and assignments (thousands
of rows) are inserted in bulk, with the GPU-overlap trigger still checking every assignment.
GPU UUIDs follow the agent simulator's scheme, so ``gpumeter-agent --simulate 8 --node-name
HOST`` reports the same GPUs live.
"""

from __future__ import annotations

import math
import random
import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from app.core.epoch import from_epoch
from app.customers.schemas import CustomerCreate
from app.customers.service import create_customer
from app.fleet import service as fleet_service
from app.fleet.models import Pool
from app.plans.schemas import PlanCreate
from app.plans.service import create_plan
from app.rentals import service as rentals_service
from app.simulate.history import DAY, SimGpu
from metering_agent.nvml.simulated import sim_uuid

GPUS_PER_NODE = 8
# NVML model -> (share of the fleet's nodes, on-demand price per GPU-hour in USD, monthly cap
# per GPU in USD: "tier + cap", the cap about 84 % of a 30-day month at the hourly price)
MODELS = {
    "NVIDIA H100 80GB HBM3": (0.6, "2.49", "1500.00"),
    "NVIDIA H200": (0.15, "3.29", "1980.00"),
    "NVIDIA A100-SXM4-80GB": (0.15, "1.59", "960.00"),
    "NVIDIA L40S": (0.1, "0.99", "600.00"),
}
# Long-rental vouchers, shared with the demo.
PLAN_TERMS: dict[str, Any] = {
    "voucher_tiers": [{"min_days": 7, "percent": "5"}, {"min_days": 30, "percent": "15"}],
    "voucher_validity_days": 90,
}
SPARE_EVERY = 20  # one node in 20 of each model is a spare
RENTED_SHARE = 0.88
SPLITS = ([8], [8], [4, 4], [2, 2, 4], [1, 1, 2, 4])


@dataclass(frozen=True, slots=True)
class Fleet:
    gpus: list[SimGpu]
    customers: int
    rentals: int


def plan_prices(effective_from: int) -> list[dict[str, str]]:
    since = from_epoch(effective_from).isoformat()
    return [
        {
            "gpu_model": m,
            "price_per_hour": price,
            "monthly_cap_per_gpu": cap,
            "effective_from": since,
        }
        for m, (_, price, cap) in MODELS.items()
    ]


def create_fleet(
    session: Session, gpus: int, start: int, end: int, rng: random.Random, tag: str
) -> Fleet:
    """Nodes, GPUs, a plan, customers and rentals whose assignments cover ``[start, end)``."""
    nodes = _nodes(math.ceil(gpus / GPUS_PER_NODE), rng, tag)
    gpu_rows = _gpus(nodes, gpus)
    fleet_service.insert_nodes_and_gpus(
        session, [{k: v for k, v in n.items() if k != "model"} for n in nodes], gpu_rows
    )
    plan = create_plan(
        session,
        PlanCreate.model_validate(
            {"name": f"sim-{tag}", "prices": plan_prices(start - 400 * DAY), **PLAN_TERMS}
        ),
    )
    customers = [
        create_customer(session, CustomerCreate(name=f"Customer {i + 1} ({tag})")).id
        for i in range(max(3, gpus // 60))
    ]
    rentals, assignments = _rentals(gpu_rows, plan.id, customers, start, end, rng)
    if rentals:
        rentals_service.insert_rentals(session, rentals, assignments)
    sims = [SimGpu(g["uuid"], g["model"]) for g in gpu_rows]
    return Fleet(sims, len(customers), len(rentals))


def _nodes(count: int, rng: random.Random, tag: str) -> list[dict[str, Any]]:
    models = list(MODELS)
    weights = [share for share, *_ in MODELS.values()]
    return [
        {
            "id": uuid.uuid4(),
            "hostname": f"sim-{tag}-{i:05d}",
            "datacenter": f"dc{i % 3 + 1}",
            "topology_group": f"rack{i // 16:04d}",
            "model": rng.choices(models, weights)[0],
        }
        for i in range(count)
    ]


def _gpus(nodes: list[dict[str, Any]], total: int) -> list[dict[str, Any]]:
    seen: dict[str, int] = {}
    rows: list[dict[str, Any]] = []
    for node in nodes:
        n = seen[node["model"]] = seen.get(node["model"], 0) + 1
        pool = Pool.SPARE if n % SPARE_EVERY == 2 else Pool.RENTABLE  # 2nd, 22nd, ... node
        for i in range(min(GPUS_PER_NODE, total - len(rows))):
            uid = sim_uuid(node["hostname"], i)
            rows.append({"uuid": uid, "node_id": node["id"], "model": node["model"], "pool": pool})
    return rows


def _rentals(
    gpus: list[dict[str, Any]],
    plan_id: uuid.UUID,
    customers: list[uuid.UUID],
    start: int,
    end: int,
    rng: random.Random,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    by_node: dict[uuid.UUID, list[dict[str, Any]]] = {}
    for g in gpus:
        if g["pool"] == Pool.RENTABLE:
            by_node.setdefault(g["node_id"], []).append(g)
    rentals: list[dict[str, Any]] = []
    assignments: list[dict[str, Any]] = []
    for node_gpus in by_node.values():
        if rng.random() >= RENTED_SHARE:
            continue
        cursor = 0
        for size in rng.choice(SPLITS):
            group = node_gpus[cursor : cursor + size]
            cursor += size
            if not group:
                break
            rental = _rental(plan_id, rng.choice(customers), group, start, end, rng)
            rentals.append(rental)
            assignments += [
                {
                    "rental_id": rental["id"],
                    "customer_id": rental["customer_id"],
                    "gpu_uuid": g["uuid"],
                    "start_at": rental["start_at"],
                    "end_at": rental["end_at"],
                }
                for g in group
            ]
    return rentals, assignments


def _rental(
    plan_id: uuid.UUID,
    customer_id: uuid.UUID,
    group: list[dict[str, Any]],
    start: int,
    end: int,
    rng: random.Random,
) -> dict[str, Any]:
    """Half run from before the window (long rentals earn vouchers); some end inside it."""
    if rng.random() < 0.5:
        begin = start - rng.randrange(DAY, 60 * DAY)
    else:
        begin = rng.randrange(start, start + (end - start) * 9 // 10)
    finish = begin + rng.randrange(3600, 25 * DAY) if rng.random() < 0.45 else None
    return {
        "id": uuid.uuid4(),
        "customer_id": customer_id,
        "plan_id": plan_id,
        "gpu_model": group[0]["model"],
        "gpu_count": len(group),
        "start_at": from_epoch(begin),
        "end_at": None if finish is None or finish >= end else from_epoch(finish),
    }


@dataclass(frozen=True, slots=True)
class OneCustomerFleet:
    """One customer renting ``rented`` GPUs of one model; spare nodes beside them."""

    gpus: list[SimGpu]
    customer_id: uuid.UUID
    rental_id: uuid.UUID
    rented: int
    spares: int


def create_one_customer_fleet(
    session: Session,
    gpus: int,
    model: str,
    price_per_hour: str,
    start: int,
    end: int,
    tag: str,
) -> OneCustomerFleet:
    """One rental of ``gpus`` GPUs over ``[start, end)``, one spare node per ``SPARE_EVERY``.

    The plan bills per second with no cap, no vouchers and no stall credit: the what-if swaps
    the increment in.
    Names derive from ``tag`` alone, so a seed gives the same GPU UUIDs (and history) each run.
    """
    rented_nodes = math.ceil(gpus / GPUS_PER_NODE)
    spare_nodes = math.ceil(rented_nodes / SPARE_EVERY)
    nodes: list[dict[str, Any]] = [
        {
            "id": uuid.uuid5(uuid.NAMESPACE_DNS, f"{tag}-{i:05d}"),
            "hostname": f"{tag}-{i:05d}",
            "datacenter": "dc1",
            "topology_group": f"rack{i // 16:04d}",
        }
        for i in range(rented_nodes + spare_nodes)
    ]
    rows: list[dict[str, Any]] = [
        {
            "uuid": sim_uuid(node["hostname"], i),
            "node_id": node["id"],
            "model": model,
            "pool": Pool.RENTABLE if n < rented_nodes else Pool.SPARE,
        }
        for n, node in enumerate(nodes)
        for i in range(GPUS_PER_NODE)
    ]
    rows = rows[:gpus] + rows[rented_nodes * GPUS_PER_NODE :]  # a part node rents its first GPUs
    fleet_service.insert_nodes_and_gpus(session, nodes, rows)
    since = from_epoch(start).isoformat()
    plan = create_plan(
        session,
        PlanCreate.model_validate(
            {
                "name": tag,
                "prices": [
                    {"gpu_model": model, "price_per_hour": price_per_hour, "effective_from": since}
                ],
                # The one rental stands for a customer's whole fleet, not one job: a failure
                # stalls no other GPU's work, so no stall credit (the what-if compares failure
                # and migration credits alone).
                "credit_stall": False,
            }
        ),
    )
    customer = create_customer(session, CustomerCreate(name=f"Customer ({tag})"))
    rental_id = uuid.uuid5(uuid.NAMESPACE_DNS, f"{tag}-rental")
    rental: dict[str, Any] = {
        "id": rental_id,
        "customer_id": customer.id,
        "plan_id": plan.id,
        "gpu_model": model,
        "gpu_count": gpus,
        "start_at": from_epoch(start),
        "end_at": from_epoch(end),
    }
    rentals_service.insert_rentals(
        session,
        [rental],
        [
            {
                "rental_id": rental["id"],
                "customer_id": customer.id,
                "gpu_uuid": g["uuid"],
                "start_at": rental["start_at"],
                "end_at": rental["end_at"],
            }
            for g in rows[:gpus]
        ],
    )
    sims = [SimGpu(g["uuid"], model) for g in rows]
    return OneCustomerFleet(sims, customer.id, rental_id, gpus, len(rows) - gpus)
