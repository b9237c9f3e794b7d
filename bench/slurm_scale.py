"""A Slurm cluster of 10,000 jobs, round after round: what a round costs the service and the
adapter, and how many bytes the adapter posts.

The table is the recorded 22.05 ``squeue --json`` record (tests/slurm/fixtures), scaled: one
GPU per job on 8-GPU nodes, ``--jobs`` of them, a mapped account per hundred jobs. The real
adapter (``app.slurm.adapter``) runs round after round over it, its calls to the service
answered by the service's functions in a process of their own (no HTTP). Round 0 attributes
every job (a cold start); each later round replays a round's changes: ``--churn`` of the
jobs end and as many new ones start on the freed GPUs, the rest are unchanged (the adapter
posts the changes only; the whole listing every 30th round, which the default 30 rounds
include). Per round, on a fresh database
(GPUMETER_DATABASE_URL's server):
- adapter CPU: parsing squeue's JSON, finding what changed, building and encoding what it
  posts (the bench's process);
- service CPU: validating the snapshot and ``record_snapshot`` in its own transaction (the
  service process's CPU; Postgres's is not counted), and its wall time;
- bytes posted.
Goal: <= 100 ms of service CPU per round at 10,000 jobs, the periodic whole listing included
(the mean over the rounds after the cold start).

Prints progress on stderr and one final JSON line on stdout.
"""

from __future__ import annotations

import argparse
import copy
import json
import multiprocessing
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from multiprocessing.connection import Connection
from pathlib import Path
from statistics import fmean, median
from typing import Any, cast

from failover import say  # bench/ is this script's directory

import app.models  # noqa: F401 - registers every table, so foreign keys resolve
from app import wiring
from app.core.console_client import Api
from app.core.db import get_engine, transaction
from app.core.scratch_db import scratch_database, server_from_environment
from app.customers.models import Customer
from app.fleet.models import Gpu, Node
from app.plans.models import PlanPrice, PricePlan
from app.slurm.adapter import FULL_EVERY, Adapter, AdapterConfig
from app.slurm.models import SlurmAccount
from app.slurm.scheduler import Slurm, SlurmRefused
from app.slurm.schemas import Snapshot
from app.slurm.service import record_snapshot

RECORD = Path(__file__).resolve().parents[1] / "tests/slurm/fixtures/squeue-22.05.json"
GPUS_PER_NODE = 8
JOBS_PER_ACCOUNT = 100
TARGET_SERVICE_CPU_MS = 100.0
SERVICE_TIMEOUT_S = 600  # a cold start of 10,000 jobs takes about 40 s


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


class ReplayedSlurm(Slurm):
    """Slurm answering from the replayed table: squeue's JSON of this round; no accounting
    (the jobs end in the table itself), no nodes or reservation to keep."""

    def __init__(self) -> None:
        super().__init__()
        self.squeue = ""

    def run(self, *command: str) -> str:
        if command[0] == "sacct":
            raise SlurmRefused("sacct: Slurm accounting storage is disabled")
        return self.squeue if command[0] == "squeue" else ""


class ServiceProcess:
    """The adapter's calls, answered by the service's functions in a process of their own, as
    a served service runs apart from its adapter: its CPU and its garbage collections are its
    own, not spent on the adapter's 10,000 parsed records (in one process they cost the whole
    listing 0.75 s of collections). Each snapshot in its own transaction; its CPU and wall time
    and the bytes it took are kept."""

    def __init__(self, url: str) -> None:
        context = multiprocessing.get_context("fork")
        self.pipe, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(url, child), daemon=True)
        self.process.start()
        self.service_cpu_s = self.service_wall_s = 0.0
        self.bytes_posted = 0
        self.problems: list[str] = []
        self.attributed = 0

    def get(self, path: str, **_: Any) -> dict[str, Any]:
        return {"items": []} if path.endswith("/actions") else {"spare_nodes": []}

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        sent = json.dumps(body).encode()
        self.bytes_posted += len(sent)
        self.pipe.send_bytes(sent)
        if not self.pipe.poll(SERVICE_TIMEOUT_S):
            raise TimeoutError(f"the service process answered no snapshot in {SERVICE_TIMEOUT_S} s")
        answer = self.pipe.recv()
        if "error" in answer:
            raise RuntimeError(f"the service process failed: {answer['error']}")
        self.service_cpu_s += answer["cpu_s"]
        self.service_wall_s += answer["wall_s"]
        result = cast(dict[str, Any], answer["result"])
        self.problems += [p["detail"][:200] for p in result["problems"]]
        self.attributed += result["attributed"]
        return result

    def close(self) -> None:
        """Stop the service process (an empty message), killed if it does not stop in time."""
        self.pipe.send_bytes(b"")
        self.process.join(SERVICE_TIMEOUT_S)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()


def _serve(url: str, pipe: Connection) -> None:
    """The service process: validate each snapshot and record it, as the endpoint does."""
    engine = get_engine(url)
    engine.dispose(close=False)  # the parent's pooled connections stay the parent's
    while sent := pipe.recv_bytes():
        cpu, wall = time.process_time(), time.monotonic()
        try:
            snapshot = Snapshot.model_validate_json(sent)
            with transaction(engine) as session:
                result = record_snapshot(session, snapshot)
        except Exception as error:  # reported to the parent, which stops the bench
            pipe.send({"error": repr(error)})
            continue
        cpu_s, wall_s = time.process_time() - cpu, time.monotonic() - wall
        pipe.send({"result": result.model_dump(mode="json"), "cpu_s": cpu_s, "wall_s": wall_s})


def measure(url: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """The real adapter's rounds over the replayed table; the adapter's CPU is the round's
    less the service's (both run in this process)."""
    slurm, api = ReplayedSlurm(), ServiceProcess(url)
    try:
        return list(_rounds(slurm, api, args))
    finally:
        api.close()


def _rounds(
    slurm: ReplayedSlurm, api: ServiceProcess, args: argparse.Namespace
) -> Iterator[dict[str, Any]]:
    adapter = Adapter(cast(Api, api), slurm, AdapterConfig("bench", poll_s=1.0))
    for r, records in rounds(args, int(time.time()) - 600):
        slurm.squeue = json.dumps({"jobs": records, "errors": []})
        api.service_cpu_s = api.service_wall_s = 0.0
        api.bytes_posted, api.problems, api.attributed = 0, [], 0
        cpu = time.process_time()
        adapter.round()
        adapter.rounds += 1
        round_cpu_s = time.process_time() - cpu
        figure = {
            "round": r, "whole_listing": r % FULL_EVERY == 0, "jobs": len(records),
            "attributed": api.attributed,
            "problems": api.problems[:3],
            "adapter_cpu_ms": round(round_cpu_s * 1000, 1),
            "service_cpu_ms": round(api.service_cpu_s * 1000, 1),
            "service_wall_ms": round(api.service_wall_s * 1000, 1),
            "bytes_posted": api.bytes_posted,
        }  # fmt: skip
        say(json.dumps(figure))
        yield figure


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000, help="jobs in the table")
    parser.add_argument("--rounds", type=int, default=FULL_EVERY, help="after the cold start")
    parser.add_argument(
        "--churn", type=float, default=0.001,
        help="share of jobs ending a round (default 0.001: at 1-s rounds, 10 of 10,000 jobs end "
        "and 10 start each second, 864,000 jobs a day, a job's mean run 17 minutes)",
    )  # fmt: skip
    args = parser.parse_args()
    if args.jobs < 1 or args.rounds < 1 or not 0 < args.churn < 1:
        raise SystemExit("--jobs and --rounds must be >= 1, --churn within (0, 1)")
    started = time.monotonic()
    wiring.install()  # the service's subscribers and hooks, as a serve process has them
    with scratch_database(server_from_environment(), "gpumeter_slurm_scale") as url:
        say(f"{args.jobs} jobs on {-(-args.jobs // GPUS_PER_NODE)} nodes")
        fleet(url, args.jobs)
        figures = measure(url, args)
    later = figures[1:]
    steady = [f for f in later if not f["whole_listing"]]
    service = round(fmean(f["service_cpu_ms"] for f in later), 1)
    result = {
        "jobs": args.jobs, "rounds": args.rounds, "churn": args.churn,
        "cold_start": figures[0],
        "steady_service_cpu_ms_p50": median(f["service_cpu_ms"] for f in steady),
        "steady_adapter_cpu_ms_p50": median(f["adapter_cpu_ms"] for f in steady),
        "steady_bytes_posted_p50": median(f["bytes_posted"] for f in steady),
        "whole_listing_rounds": [f for f in later if f["whole_listing"]],
        "service_cpu_ms_mean": service,
        "adapter_cpu_ms_mean": round(fmean(f["adapter_cpu_ms"] for f in later), 1),
        "target_service_cpu_ms": TARGET_SERVICE_CPU_MS,
        "problems": sum(len(f["problems"]) for f in figures),
        "ok": not any(f["problems"] for f in figures) and service <= TARGET_SERVICE_CPU_MS,
        "wall_s": round(time.monotonic() - started, 1),
    }  # fmt: skip
    print(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
