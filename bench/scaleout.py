"""Scale-out benchmark: where Postgres, not Python, becomes ingest's limit.

The service is stateless, so more service processes (here) or API hosts (in production) add
Python; all of them share one Postgres. For 1, 2 and 4 service processes (``--workers-list``)
this drives agent-shaped batches (8 GPUs, 2-s records, kept-alive connections) closed-loop,
``--concurrency`` in flight, for ``--seconds``, and reads from /proc the CPU the service's
processes, this database's Postgres backends and the load generator (this process) used.
CPU per request then gives each side's ceiling: Python's per core, Postgres's for the cores
(``--pg-cores``, default this machine's) it would have on a box of its own. The point past
which adding API processes or hosts cannot help is Postgres's ceiling; the final JSON line
prints it (``postgres_limit_batches_per_s``) with the API cores needed to reach it.

Creates and drops its own database on GPUMETER_DATABASE_URL's server.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import sys
import time
from typing import Any

from ingest import (
    AgentNode,
    CpuClock,
    PhaseStats,
    Target,
    phase_report,
    register_nodes,
    start_service,
    upload,
    vacuum,
)
from sqlalchemy import make_url

from app.core.processes import stop_child
from app.core.scratch_db import scratch_database, server_from_environment
from app.settings import sqlalchemy_url

FLEET_INTERVALS_S = (2, 5, 10, 15, 30)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers-list", default="1,2,4", help="service processes per run")
    p.add_argument("--seconds", type=float, default=15.0, help="load per run")
    p.add_argument("--concurrency", type=int, default=40, help="batches in flight")
    p.add_argument("--nodes", type=int, default=1500, help="nodes (each sends ≤ 1 batch/s)")
    p.add_argument("--pg-cores", type=int, default=os.cpu_count() or 1)
    p.add_argument(
        "--node-interval",
        type=float,
        default=1.0,
        help="least seconds between a node's uploads: the seconds a batch carries (the agent's"
        " upload interval; more nodes are needed for the same batches/s at a longer one)",
    )
    return p.parse_args()


async def closed_loop(
    nodes: collections.deque[AgentNode],
    target: Target,
    concurrency: int,
    seconds: float,
    node_interval: float = 1.0,
) -> PhaseStats:
    """``concurrency`` connections, each sending the next node's batch as soon as its last
    one is answered; a node sends at most once every ``node_interval`` s (its records end at
    the present)."""
    stats = PhaseStats()
    deadline = time.monotonic() + seconds
    rng = random.Random(3)

    async def lane() -> None:
        while time.monotonic() < deadline:
            node = nodes.popleft()
            wait = node.next_start + node_interval - time.time()
            if wait > 0:
                await asyncio.sleep(wait)
            await upload(node, target, rng, True, stats)
            nodes.append(node)

    await asyncio.gather(*(lane() for _ in range(concurrency)))
    return stats


async def run(url: str, tokens: list[str], args: argparse.Namespace) -> list[dict[str, Any]]:
    nodes = collections.deque(AgentNode(i, tok) for i, tok in enumerate(tokens))
    runs = []
    for workers in [int(w) for w in args.workers_list.split(",")]:
        process, base = await asyncio.to_thread(start_service, url, workers, ["--no-worker"])
        try:
            host, port = base.removeprefix("http://").split(":")
            target = Target(host, int(port), gzip=True)  # as the agent sends them
            clock = CpuClock(process.pid, make_url(sqlalchemy_url(url)).database or "")
            await closed_loop(nodes, target, args.concurrency, 3.0)  # warm-up
            await asyncio.to_thread(vacuum, url, analyze=True)  # steady state's statistics
            before = clock.sample()
            stop = asyncio.Event()
            tracking = asyncio.create_task(clock.track(stop))
            began = time.monotonic()
            stats = await closed_loop(
                nodes, target, args.concurrency, args.seconds, args.node_interval
            )
            elapsed = time.monotonic() - began
            stop.set()
            await tracking
            cpu = CpuClock.used(before, clock.sample())
        finally:
            for node in nodes:
                if node.writer is not None:
                    node.writer.close()
                node.reader = node.writer = None
            await asyncio.to_thread(stop_child, process, "service")
        report = phase_report(stats, elapsed, cpu, len(tokens), 1.0)
        # Open-loop figures; GPU-seconds carry the gap since each node's previous run.
        for key in ("offered_batches_per_s", "gpu_seconds_per_s", "late_uploads"):
            report.pop(key)
        batches = len(stats.latencies) or 1
        report |= {
            "records_per_batch": round(stats.records / batches, 2),
            "workers": workers,
            "service_cpu_ms_per_batch": round(1000 * cpu["service"] / batches, 2),
            "postgres_cpu_ms_per_batch": round(1000 * cpu["postgres"] / batches, 2),
            "client_cpu_ms_per_batch": round(1000 * cpu["client"] / batches, 2),
            "postgres_share_of_server_cpu": round(
                cpu["postgres"] / max(1e-9, cpu["postgres"] + cpu["service"]), 2
            ),
        }
        print(json.dumps(report), file=sys.stderr)
        runs.append(report)
    return runs


def main() -> int:
    args = parse_args()
    with scratch_database(server_from_environment(), "gpumeter_bench_scaleout") as url:
        tokens = register_nodes(url, args.nodes)
        runs = asyncio.run(run(url, tokens, args))
    # The least contended run (most processes) gives the cleanest CPU per batch.
    best = max(runs, key=lambda r: r["batches_per_s"])
    pg_ms, py_ms = best["postgres_cpu_ms_per_batch"], best["service_cpu_ms_per_batch"]
    pg_limit = round(1000 * args.pg_cores / pg_ms) if pg_ms else None
    print(
        json.dumps(
            {
                "runs": runs,
                "measured_best_batches_per_s": best["batches_per_s"],
                "service_cpu_ms_per_batch": py_ms,
                "postgres_cpu_ms_per_batch": pg_ms,
                # Python's ceiling per core of API host; Postgres's on --pg-cores of its own.
                "python_batches_per_s_per_core": round(1000 / py_ms) if py_ms else None,
                "postgres_limit_batches_per_s": pg_limit,
                # The fleet one Postgres primary carries (8-GPU nodes) at each upload
                # interval, at this run's Postgres CPU per batch: most of a batch's cost is per
                # batch, not per second it carries (measure a longer interval's own batches
                # with --node-interval to check that).
                "postgres_limit_gpus_by_upload_interval_s": pg_limit
                and {str(s): pg_limit * s * 8 for s in FLEET_INTERVALS_S},
                "node_interval_s": args.node_interval,
                "records_per_batch": best["records_per_batch"],
                "api_cores_to_reach_postgres_limit": pg_limit and round(pg_limit * py_ms / 1000, 1),
                "pg_cores": args.pg_cores,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
