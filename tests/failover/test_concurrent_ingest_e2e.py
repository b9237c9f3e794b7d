"""Parallel real HTTP ingests against `gpumeter serve`: six nodes report a rented GPU failed at
once, while their own spares are reported healthy in the same batches (so each ingest holds
its spare's row as another node's failover wants it). Three spares for six failures: each
spare is promised once, the other three failovers find none, and no request fails."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine

from app.auth.models import KeyKind
from app.auth.service import issue_key
from app.core.db import transaction
from tests.e2e.conftest import Service
from tests.failover.conftest import PRICE, iso
from tests.metering.conftest import minute_ago, rec

NODES = 6
SPARES = 3  # on the first three nodes


@pytest.fixture
def service(db: Engine, database_url: str, tmp_path: Path) -> Iterator[tuple[Service, str]]:
    with transaction(db) as session:
        admin = issue_key(session, KeyKind.ADMIN, "e2e").secret
    running = Service(database_url, tmp_path)
    running.start()
    try:
        yield running, admin
    finally:
        running.stop()


@pytest.mark.e2e
def test_parallel_ingests_never_promise_a_spare_twice(service: tuple[Service, str]) -> None:
    running, admin = service
    api = httpx.Client(base_url=running.url, headers={"Authorization": f"Bearer {admin}"})

    def post(path: str, body: dict[str, Any]) -> dict[str, Any]:
        response = api.post(path, json=body)
        assert response.status_code == 201, response.text
        return dict(response.json())

    t0 = minute_ago(5)
    customer = post("/v1/customers", {"name": "Acme"})["id"]
    price = {"gpu_model": "H100", "price_per_hour": PRICE, "effective_from": iso(t0 - 86400)}
    plan = post("/v1/plans", {"name": "p", "prices": [price]})["id"]
    tokens = []
    for n in range(NODES):
        node = post("/v1/nodes", {"hostname": f"n{n}", "datacenter": "fra1"})
        tokens.append(node["token"]["key"])
        gpu = {"node_id": node["node"]["id"], "model": "H100"}
        post("/v1/gpus", {**gpu, "uuid": f"GPU-{n}"})
        if n < SPARES:
            post("/v1/gpus", {**gpu, "uuid": f"S-{n}", "pool": "spare"})
        rental = post(
            "/v1/rentals",
            {
                "customer_id": customer,
                "plan_id": plan,
                "gpu_model": "H100",
                "gpu_count": 1,
                "start_at": iso(t0),
            },
        )
        post(
            f"/v1/rentals/{rental['id']}/assignments", {"gpu_uuid": f"GPU-{n}", "start_at": iso(t0)}
        )

    start = threading.Barrier(NODES)
    statuses: list[int] = []

    def report(n: int) -> None:
        records = [rec(f"GPU-{n}", t0, t0 + 30), rec(f"GPU-{n}", t0 + 30, t0 + 60, "failed")]
        if n < SPARES:
            records.append(rec(f"S-{n}", t0, t0 + 60))
        body = {"batch_id": f"b-{n}", "records": records, "events": []}
        with httpx.Client(base_url=running.url, timeout=30) as agent:
            start.wait(timeout=30)
            response = agent.post(
                "/v1/ingest", json=body, headers={"Authorization": f"Bearer {tokens[n]}"}
            )
        statuses.append(response.status_code)

    threads = [threading.Thread(target=report, args=(n,)) for n in range(NODES)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert statuses == [200] * NODES

    failovers = api.get("/v1/failovers?limit=100").json()["items"]
    assert len(failovers) == NODES  # one per failed GPU
    reserved = sorted(f["spare_gpu_uuid"] for f in failovers if f["state"] == "requested")
    assert reserved == [f"S-{n}" for n in range(SPARES)]  # each spare once, all taken
    assert sum(f["state"] == "no_spare" for f in failovers) == NODES - SPARES
