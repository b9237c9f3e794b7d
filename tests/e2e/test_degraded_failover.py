"""Migration on degradation end to end, in real processes (issue 42): a real agent's simulated
GPU throttles for heat and stays throttled, sending no new state change; the service's worker
notices it has been degraded for the plan's time, requests a failover to the spare as a signed
webhook, the orchestrator answers "resumed", and the invoice bills the degraded seconds and
credits the migration window and the job's other GPU, to the cent."""

from __future__ import annotations

import time
from datetime import datetime
from decimal import Decimal

import pytest

from app.core.console_client import Api
from app.core.epoch import epoch, from_epoch
from app.core.processes import stop_child
from app.demo.orchestrator import Orchestrator
from metering_agent.nvml.simulated import DEFAULT_MODEL, sim_uuid
from tests.e2e.conftest import Fleet

# The service allowed to call the orchestrator on 127.0.0.1, the API client, the orchestrator
# (resuming RESUME_AFTER_S = 3 s after each request).
from tests.e2e.test_failover import api as api
from tests.e2e.test_failover import loop_fleet as loop_fleet
from tests.e2e.test_failover import orchestrator as orchestrator
from tests.harness import wait_for

pytestmark = pytest.mark.e2e

NODE = "deg-node"
PRICE = "36.00"  # per GPU-hour: one cent a second
AFTER_S = 6  # the plan moves a GPU throttled this long
FAULT_AT_S = 3
PROMISE_S = 30  # degraded for the plan's time -> running on the spare


def _second(moment: str) -> int:
    return epoch(datetime.fromisoformat(moment))


def test_a_gpu_throttled_past_the_plans_time_moves_to_the_spare_and_is_billed_by_the_plan(
    loop_fleet: Fleet, api: Api, orchestrator: Orchestrator
) -> None:
    t0 = int(time.time())
    node = api.post("/v1/nodes", {"hostname": NODE, "datacenter": "e2e-1"})
    hot, peer, spare = (sim_uuid(NODE, i, NODE) for i in range(3))
    for gpu, pool in ((hot, "rentable"), (peer, "rentable"), (spare, "spare")):
        body = {"uuid": gpu, "node_id": node["node"]["id"], "model": DEFAULT_MODEL, "pool": pool}
        api.post("/v1/gpus", body)
    prices = [{"gpu_model": DEFAULT_MODEL, "price_per_hour": PRICE,
               "effective_from": "2026-01-01T00:00:00Z"}]  # fmt: skip
    plan = api.post(
        "/v1/plans",
        {"name": "move when hot", "prices": prices, "migrate_degraded_after_s": AFTER_S,
         "migrate_degraded_causes": ["thermal_slowdown", "nvlink_down"]},
    )  # fmt: skip
    customer = api.post("/v1/customers", {"name": "Acme AI", "currency": "USD"})
    start = from_epoch(t0).isoformat()
    rental = api.post(
        "/v1/rentals",
        {"customer_id": customer["id"], "plan_id": plan["id"], "gpu_model": DEFAULT_MODEL,
         "gpu_count": 2, "start_at": start},
    )  # fmt: skip
    for gpu in (hot, peer):
        api.post(f"/v1/rentals/{rental['id']}/assignments", {"gpu_uuid": gpu, "start_at": start})
    agent = loop_fleet.agent(
        NODE, node["token"]["key"], "--simulate", "3",
        faults=[{"at": FAULT_AT_S, "gpu": 0, "fault": "thermal_slowdown", "duration": 600}],
    )  # fmt: skip
    wait_for(orchestrator.resumed, "the orchestrator resumed the failover", timeout_s=120)
    (resume,) = orchestrator.resumed().values()
    (requested,) = orchestrator.events("failover.requested")
    assert (requested.data["trigger"], requested.data["degraded_causes"]) == (
        "degraded",
        ["thermal_slowdown"],
    )
    assert (requested.data["failed_gpu_uuid"], requested.data["spare_gpu_uuid"]) == (hot, spare)
    timeline = api.get(f"/v1/gpus/{hot}/timeline", start=t0, end=int(time.time()) + 1)
    degraded_s = min(s["start_s"] for s in timeline["segments"] if s["state"] == "degraded")
    decided_s = _second(requested.data["failed_at"])
    assert decided_s >= degraded_s + AFTER_S  # never before the plan's time
    assert resume.resumed_at - (degraded_s + AFTER_S) <= PROMISE_S

    ended = resume.resumed_at + 2
    wait_for(lambda: time.time() >= ended + 1, "the rental's last second passed", timeout_s=10)
    api.post(f"/v1/rentals/{rental['id']}/end", {"end_at": from_epoch(ended).isoformat()})
    assert stop_child(agent, "agent") == 0
    api.post("/v1/invoices/runs", {"period": f"{from_epoch(ended):%Y-%m}"})
    (listed,) = api.get("/v1/invoices", customer_id=customer["id"])["items"]
    lines = api.get(f"/v1/invoices/{listed['id']}")["lines"]
    window_s = resume.resumed_at - decided_s
    by_kind = {line["kind"]: line for line in lines}
    migration, stall = by_kind["migration_credit"], by_kind["stall_credit"]
    assert (migration["gpu_uuid"], migration["seconds"]) == (hot, window_s)
    assert Decimal(migration["amount"]) == -Decimal(window_s) / 100
    assert (stall["gpu_uuid"], stall["seconds"]) == (peer, window_s)
    assert Decimal(stall["amount"]) == -Decimal(window_s) / 100
    assert "failure_credit" not in by_kind and "degraded_credit" not in by_kind
