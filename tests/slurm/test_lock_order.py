"""A snapshot and an ingest touching the same GPUs at once wait for each other in turn, never
crosswise: Postgres would end one of them as a deadlock victim (answered 503, retried)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from app.core.db import pipelined, transaction
from app.fleet.service import record_latest
from app.metering.repository import lock_nodes_statement
from tests.harness import wait_for
from tests.slurm.conftest import CLUSTER, SlurmWorld, gpu_of, job

BLOCKED_BY = text("SELECT count(*) FROM pg_stat_activity WHERE :pid = ANY(pg_blocking_pids(pid))")


def _blocked_by(db: Engine, pid: int) -> int:
    """How many sessions wait for a lock the session ``pid`` holds (read afresh: a
    transaction keeps its first view of pg_stat_activity)."""
    with db.connect() as connection:
        return int(connection.execute(BLOCKED_BY, {"pid": pid}).scalar_one())


def test_a_snapshot_and_a_group_commit_of_the_same_nodes_never_deadlock(
    world: SlurmWorld, client: TestClient, db: Engine
) -> None:
    """An ingest stores n1's and n2's batches in one group commit, as ``store_together`` does:
    it holds both nodes' locks and has written n1's GPU 0 row, n2's GPU 0 row next. A snapshot
    comes meanwhile: job 1 on n2's GPU 0, job 2 on n1's GPU 0. Locking GPU rows job by job, it
    held n2's GPU 0 while it waited for n1's, which the ingest held while it waited for n2's:
    deadlocked. It waits for the nodes' locks first, and both go through."""
    t0 = world.t0
    nodes = {g["uuid"]: g["node_id"] for g in world.get("/v1/gpus?limit=100")["items"]}
    first, second = gpu_of("n1", 0), gpu_of("n2", 0)
    jobs = [
        job(1, "RUNNING", start=t0, nodes={"n2": [0]}),
        job(2, "RUNNING", start=t0, nodes={"n1": [0]}),
    ]
    with ThreadPoolExecutor(1) as pool:
        with transaction(db) as ingest:
            pid = ingest.scalar(text("SELECT pg_backend_pid()"))
            pipelined(ingest, [lock_nodes_statement([nodes[first], nodes[second]])])
            record_latest(ingest, {first: ("H100", "healthy", t0 + 5, 0, None)})
            body = {"cluster": CLUSTER, "taken_at": t0 + 6, "jobs": jobs}
            answer = pool.submit(
                client.post, "/v1/slurm/snapshots", json=body, headers=world.console.headers
            )
            wait_for(lambda: _blocked_by(db, pid), "the snapshot waiting for the ingest")
            record_latest(ingest, {second: ("H100", "healthy", t0 + 5, 0, None)})
        response: httpx.Response = answer.result(timeout=30)
    assert response.status_code == 200, response.text
    assert response.json()["attributed"] == 2
    assert world.assignments(1) == [(second, t0, None)]
    assert world.assignments(2) == [(first, t0, None)]
