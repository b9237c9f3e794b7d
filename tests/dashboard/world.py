"""A seeded October 2026 for the dashboard tests, built through the console and ingest APIs.

Customer "Acme" (EUR, Europe/Berlin, 19 % tax) rents one H100 from 10 Oct 00:00 UTC to
12 Oct 00:00 UTC. GPU-A-1 reports healthy minutes until 12:00 on 10 Oct, then fails with
XID 79; at 12:47 the rental is migrated to GPU-A-2, which resumes at 12:47:30 and stays
healthy. Customer "Other" rents GPU-B-1 over the same days. October is invoiced and finalized.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from fastapi.testclient import TestClient

from tests.harness import Console, bearer

PERIOD = "2026-10"
START = "2026-10-10T00:00:00Z"
END = "2026-10-12T00:00:00Z"
FAILED_AT = "2026-10-10T12:00:00Z"
MIGRATED_AT = "2026-10-10T12:47:00Z"
RESUMED_AT = "2026-10-10T12:47:30Z"


def ts(text: str) -> int:
    return int(datetime.fromisoformat(text).timestamp())


@dataclass
class Tenant:
    customer: dict[str, Any]
    rental: dict[str, Any]
    key: str  # a customer API key
    gpus: list[str]


@dataclass
class World:
    acme: Tenant
    other: Tenant
    invoice: dict[str, Any]  # Acme's finalized October invoice


def _minutes(gpu: str, start: int, end: int, state: str = "healthy") -> list[dict[str, Any]]:
    """One record per minute (records never cross a minute), utilisation swinging 0..100 %."""
    out, t = [], start
    while t < end:
        stop = min(t - t % 60 + 60, end)
        util = round(50 + 50 * math.sin(t / 3600), 1) if state == "healthy" else 0.0
        out.append(
            {
                "gpu_uuid": gpu,
                "model": "H100",
                "start": t,
                "end": stop,
                "state": state,
                "sample_count": stop - t,
                "gpu_util_mean": util,
                "gpu_util_max": min(100, round(util + 5)),
                "energy_j": (120 + 5.8 * util) * (stop - t),
                "power_max_w": 720.0,
            }
        )
        t = stop
    return out


def _failure_events(gpu: str) -> list[dict[str, Any]]:
    at = ts(FAILED_AT)
    detail = {"message": "GPU has fallen off the bus"}
    return [
        {
            "event_id": f"{gpu}-xid79",
            "gpu_uuid": gpu,
            "at": at,
            "kind": "xid",
            "code": 79,
            "detail": detail,
        },
        {
            "event_id": f"{gpu}-failed",
            "gpu_uuid": gpu,
            "at": at,
            "kind": "state_change",
            "code": 79,
            "state": "failed",
            "rule": "xid_79_fallen_off_bus",
            "detail": detail,
        },
    ]


def _ingest(client: TestClient, token: str, records: list[dict], events: list[dict]) -> None:
    for n, i in enumerate(range(0, max(len(records), 1), 5000)):
        body = {
            "batch_id": f"seed-{n}-{len(records)}",
            "records": records[i : i + 5000],
            "events": events if n == 0 else [],
        }
        response = client.post("/v1/ingest", json=body, headers=bearer(token))
        assert response.status_code == 200, response.text


def _tenant(console: Console, name: str, plan_id: str, gpus: list[str], **fields: Any) -> Tenant:
    customer = console.customer(name, **fields)
    rental = console.rental(customer["id"], plan_id, start_at=START, end_at=END)
    console.assign(rental["id"], gpus[0], START)
    key = console.post(f"/v1/customers/{customer['id']}/keys", {"name": "dashboard"})["key"]
    return Tenant(customer, rental, key, gpus)


def build(console: Console) -> World:
    tiers = [{"min_days": 1, "percent": "5"}]
    plan = console.plan("eu-on-demand", price="2.49", currency="EUR", voucher_tiers=tiers)
    registered = console.node("node-fra-1")
    node, token = registered["node"], registered["token"]["key"]
    for gpu in ("GPU-A-1", "GPU-A-2", "GPU-B-1"):
        console.gpu(node["id"], gpu)
    tz = {"currency": "EUR", "billing_timezone": "Europe/Berlin", "tax_rate": "0.19"}
    acme = _tenant(
        console, "Acme", plan["id"], ["GPU-A-1", "GPU-A-2"], email="ops@acme.example.com", **tz
    )
    other = _tenant(console, "Other", plan["id"], ["GPU-B-1"], email="it@other.example.com", **tz)
    console.post(
        f"/v1/rentals/{acme.rental['id']}/migrations",
        {
            "from_gpu_uuid": "GPU-A-1",
            "to_gpu_uuid": "GPU-A-2",
            "failed_at": MIGRATED_AT,
            "resumed_at": RESUMED_AT,
            "reason": "XID 79 on GPU-A-1",
        },
    )
    failed, migrated, resumed = ts(FAILED_AT), ts(MIGRATED_AT), ts(RESUMED_AT)
    start, end = ts(START), ts(END)
    records = [
        *_minutes("GPU-A-1", start, failed),
        *_minutes("GPU-A-1", failed, migrated, "failed"),
        *_minutes("GPU-A-2", resumed, end),
        *_minutes("GPU-B-1", start, end),
    ]
    _ingest(console.client, token, records, _failure_events("GPU-A-1"))
    run = console.post(
        "/v1/invoices/runs",
        {"period": PERIOD, "customer_id": acme.customer["id"], "finalize": True, "force": True},
        status=200,
    )
    invoice = console.client.get(
        f"/v1/invoices/{run['invoice_ids'][0]}", headers=console.headers
    ).json()
    return World(acme, other, invoice)


def failover_at_the_event(console: Console) -> Tenant:
    """Customer "Zed": GPU-Z-1 fails (XID 79) at FAILED_AT and the orchestrator migrates the
    rental to GPU-Z-2 that same second, as the demo's does: the old assignment ends exactly
    at the failure event."""
    plan = console.plan("zed-plan", price="2.00", currency="EUR")
    registered = console.node("node-zed")
    node, token = registered["node"], registered["token"]["key"]
    for gpu in ("GPU-Z-1", "GPU-Z-2"):
        console.gpu(node["id"], gpu)
    zed = _tenant(console, "Zed", plan["id"], ["GPU-Z-1", "GPU-Z-2"], currency="EUR")
    console.post(
        f"/v1/rentals/{zed.rental['id']}/migrations",
        {
            "from_gpu_uuid": "GPU-Z-1",
            "to_gpu_uuid": "GPU-Z-2",
            "failed_at": FAILED_AT,
            "resumed_at": RESUMED_AT,
        },
    )
    records = [
        *_minutes("GPU-Z-1", ts(START), ts(FAILED_AT)),
        *_minutes("GPU-Z-2", ts(RESUMED_AT), ts(END)),
    ]
    _ingest(console.client, token, records, _failure_events("GPU-Z-1"))
    return zed
