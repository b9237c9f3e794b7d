"""A Slurm cluster of 10,000 jobs, round after round: what a round costs the service and the
adapter, and how many bytes the adapter posts.

The table is the recorded 22.05 ``squeue --json`` record (tests/slurm/fixtures), scaled: one
GPU per job on 8-GPU nodes, ``--jobs`` of them, a mapped account per hundred jobs. Round 0
attributes them all (a cold start); each later round replays a round's changes: ``--churn``
of the jobs end and as many new ones start on the freed GPUs, the rest are unchanged. Per
round, measured in this process on a fresh database (GPUMETER_DATABASE_URL's server):
- adapter CPU: parsing squeue's JSON and building and serialising what it posts;
- service CPU: ``record_snapshot`` in its own transaction (this process's CPU; Postgres's is
  not counted) and its wall time;
- bytes posted.
Goal: <= 100 ms of service CPU per steady round at 10,000 jobs.

Prints progress on stderr and one final JSON line on stdout.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from statistics import median
from typing import Any

from failover import say  # bench/ is this script's directory

import app.models  # noqa: F401 - registers every table, so foreign keys resolve
from app import wiring
from app.core.db import get_engine, transaction
from app.core.scratch_db import scratch_database, server_from_environment
from app.customers.models import Customer
from app.fleet.models import Gpu, Node
from app.plans.models import PlanPrice, PricePlan
from app.slurm.models import SlurmAccount
from app.slurm.scheduler import parse_job
from app.slurm.schemas import Snapshot
from app.slurm.service import record_snapshot

RECORD = Path(__file__).resolve().parents[1] / "tests/slurm/fixtures/squeue-22.05.json"
GPUS_PER_NODE = 8
JOBS_PER_ACCOUNT = 100
TARGET_SERVICE_CPU_MS = 100.0


def table(slots: range | list[int], first_id: int, start: int) -> list[dict[str, Any]]:
    """Running records, one per GPU slot (node = slot // 8): the recorded one with its id,
    account, node and GPU index changed."""
    template = json.loads(RECORD.read_text())["jobs"][0]
    records = []
    for i, slot in enumerate(slots):
        record = copy.deepcopy(template)
        node, index = f"g{slot // GPUS_PER_NODE:05d}", slot % GPUS_PER_NODE
        record.update(
            job_id=first_id + i, account=f"acct{slot // JOBS_PER_ACCOUNT}", start_time=start,
            submit_time=start - 5, restart_cnt=0, job_state="RUNNING", slot=slot,
            gres_detail=[f"gpu:1(IDX:{index})"],
            job_resources={"allocated_nodes": [{"nodename": node}], "nodes": node},
        )  # fmt: skip
        records.append(record)
    return records


def fleet(url: str, jobs: int) -> None:
    """The nodes and GPUs (device indices reported), a customer and plan per hundred jobs."""
    with transaction(get_engine(url)) as session:
        plan = PricePlan(id=uuid.uuid4(), name="per second", currency="USD")
        session.add(plan)
        session.flush()
        since = datetime(2026, 1, 1, tzinfo=UTC)
        session.add(PlanPrice(plan_id=plan.id, gpu_model="H100", price_per_hour=Decimal(36),
                              effective_from=since))  # fmt: skip
        nodes = [
            Node(id=uuid.uuid4(), hostname=f"g{n:05d}", datacenter="bench")
            for n in range(-(-jobs // GPUS_PER_NODE))
        ]
        session.add_all(nodes)
        session.flush()
        session.add_all(
            Gpu(uuid=f"GPU-{node.hostname}-{i}", node_id=node.id, model="H100", device_index=i)
            for node in nodes
            for i in range(GPUS_PER_NODE)
        )
        session.flush()
        for a in range(-(-jobs // JOBS_PER_ACCOUNT)):
            customer = Customer(id=uuid.uuid4(), name=f"tenant {a}", currency="USD")
            session.add(customer)
            session.flush()
            session.add(SlurmAccount(account=f"acct{a}", customer_id=customer.id, plan_id=plan.id))


def rounds(args: argparse.Namespace, start: int) -> Iterator[tuple[int, list[dict[str, Any]]]]:
    """Round 0's table, then each round's: ``churn`` of the oldest jobs ended, new ones in
    their place."""
    current = table(range(args.jobs), 1, start)
    yield 0, current
    changes = max(1, int(args.jobs * args.churn))
    next_id = args.jobs + 1
    for r in range(1, args.rounds + 1):
        now = start + r
        ended, kept = current[:changes], current[changes:]
        for record in ended:
            record.update(job_state="COMPLETED", end_time=now, gres_detail=[])
        fresh = table([record["slot"] for record in ended], next_id, now)
        next_id += changes
        yield r, kept + fresh + ended  # ended ones stay listed for MinJobAge
        current = kept + fresh


def measure(url: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    engine = get_engine(url)
    start = int(time.time()) - 600
    figures = []
    for r, records in rounds(args, start):
        document = json.dumps({"jobs": records})
        cpu = time.process_time()
        jobs = [parse_job(job).observation for job in json.loads(document)["jobs"]]
        snapshot = Snapshot(cluster="bench", taken_at=start + r + 1, jobs=jobs)
        body = snapshot.model_dump_json().encode()
        adapter_ms = (time.process_time() - cpu) * 1000
        received = Snapshot.model_validate_json(body)
        cpu, wall = time.process_time(), time.monotonic()
        with transaction(engine) as session:
            result = record_snapshot(session, received)
        service_ms = (time.process_time() - cpu) * 1000
        figures.append({
            "round": r, "jobs": len(jobs), "attributed": result.attributed,
            "problems": [p.detail[:200] for p in result.problems][:3],
            "adapter_cpu_ms": round(adapter_ms, 1), "service_cpu_ms": round(service_ms, 1),
            "service_wall_ms": round((time.monotonic() - wall) * 1000, 1),
            "bytes_posted": len(body),
        })  # fmt: skip
        say(json.dumps(figures[-1]))
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000, help="jobs in the table")
    parser.add_argument("--rounds", type=int, default=5, help="rounds after the cold start")
    parser.add_argument("--churn", type=float, default=0.01, help="share of jobs ending a round")
    args = parser.parse_args()
    if args.jobs < 1 or args.rounds < 1 or not 0 < args.churn < 1:
        raise SystemExit("--jobs and --rounds must be >= 1, --churn within (0, 1)")
    started = time.monotonic()
    wiring.install()  # the service's subscribers and hooks, as a serve process has them
    with scratch_database(server_from_environment(), "gpumeter_slurm_scale") as url:
        say(f"{args.jobs} jobs on {-(-args.jobs // GPUS_PER_NODE)} nodes")
        fleet(url, args.jobs)
        figures = measure(url, args)
    steady = figures[1:]
    service = median(f["service_cpu_ms"] for f in steady)
    result = {
        "jobs": args.jobs, "rounds": args.rounds, "churn": args.churn,
        "cold_start": figures[0],
        "steady_service_cpu_ms_p50": service,
        "steady_adapter_cpu_ms_p50": median(f["adapter_cpu_ms"] for f in steady),
        "steady_bytes_posted_p50": median(f["bytes_posted"] for f in steady),
        "target_service_cpu_ms": TARGET_SERVICE_CPU_MS,
        "problems": sum(len(f["problems"]) for f in figures),
        "ok": not any(f["problems"] for f in figures) and service <= TARGET_SERVICE_CPU_MS,
        "wall_s": round(time.monotonic() - started, 1),
    }  # fmt: skip
    print(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
