"""Ingest benchmark: the real service (``gpumeter serve``) on Postgres, driven by simulated nodes.

Each simulated node owns ``--gpus-per-node`` GPUs and uploads batches sequentially, as the agent
does; a batch carries ``--minutes-per-batch`` minutes of its GPUs (one steady 60 s record per GPU
per minute, the steady-state record size), with ``--change-rate`` of GPU-minutes split by a
state change (two records plus a ``state_change`` and an ``xid`` event). Time is compressed: the
batches walk forward through past hours (late data is accepted), so a 60 s run stores many
GPU-hours and the bytes per GPU-hour reflect steady rows, not one partial hour.

Prints progress every 5 s and one final JSON line. Creates and drops its own database on the
server of GPUMETER_DATABASE_URL (default postgresql://postgres@127.0.0.1:5432/postgres).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import secrets
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psycopg

import app.models  # noqa: F401 - every table registered, so foreign keys resolve
from app.core.db import transaction
from app.core.local_service import NotReady, free_port, wait_until_ready
from app.core.processes import stop_child
from app.core.scratch_db import (
    libpq_dsn,
    scratch_database,
    server_from_environment,
    table_bytes,
)
from app.settings import sqlalchemy_url

HOUR = 3600
TABLES = (
    "gpu_state_segments",
    "gpu_minute_metrics",
    "gpu_minute_metrics_open",
    "health_events",
)
RECORD = (
    '{{"gpu_uuid":"{gpu}","model":"H100 80GB HBM3","start":{start},"end":{end},'
    '"state":"{state}","sample_count":{n},{readings},"mem_total_mib":81559,'
    '"sm_clock_mean_mhz":1980}}'
)
READINGS = (
    '"gpu_util_mean":{util},"gpu_util_max":{umax},"mem_util_mean":{mem},'
    '"mem_used_max_mib":{mem_used},"energy_j":{energy},"power_max_w":{power},"temp_max_c":{temp}'
)


def readings_pool(n: int, rng: random.Random, size: int = 4096) -> list[str]:
    """Pre-formatted readings of an n-second record, each varying from the others (so that
    compressed storage is not flattered), drawn at random per record: cheap for the client."""
    pool = []
    for _ in range(size):
        util = rng.uniform(0, 100)
        power = 80 + 6 * util + rng.uniform(-20, 20)
        pool.append(
            READINGS.format(
                util=round(util, 2),
                umax=min(100, round(util) + rng.randint(0, 5)),
                mem=round(rng.uniform(0, 60), 2),
                mem_used=rng.randint(1_000, 80_000),
                energy=round(n * power * 0.95, 1),
                power=round(power + rng.uniform(0, 40), 1),
                temp=rng.randint(35 + int(util) // 4, 45 + int(util) // 3),
            )
        )
    return pool


POOLS = {n: readings_pool(n, random.Random(n)) for n in (30, 60)}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=float, default=60.0, help="seconds of load")
    p.add_argument("--workers", type=int, default=2, help="uvicorn workers")
    p.add_argument("--nodes", type=int, default=200, help="simulated nodes")
    p.add_argument("--concurrency", type=int, default=6, help="batches in flight at most")
    p.add_argument("--gpus-per-node", type=int, default=50)
    p.add_argument("--minutes-per-batch", type=int, default=10)
    p.add_argument("--change-rate", type=float, default=0.001, help="GPU-minutes with a change")
    p.add_argument("--keep-db", action="store_true", help="do not drop the database")
    return p.parse_args()


@dataclass
class Stats:
    records: int = 0
    gpu_seconds: int = 0
    latencies: list[float] = field(default_factory=list)
    errors: int = 0


def batch_body(
    node: int, gpus: int, start: int, minutes: int, rng: random.Random, change_rate: float
) -> tuple[bytes, int, int]:
    records, events = [], []
    for m in range(minutes):
        t = start + 60 * m
        for g in range(gpus):
            gpu = f"GPU-bench-{node:04d}-{g:03d}"
            if rng.random() < change_rate:
                records.append(_record(gpu, t, t + 30, "healthy", rng))
                records.append(_record(gpu, t + 30, t + 60, "degraded", rng))
                events.append(_event(gpu, t + 30))
            else:
                records.append(_record(gpu, t, t + 60, "healthy", rng))
    body = (
        f'{{"batch_id":"{secrets.token_hex(8)}","protocol_version":1,'
        f'"records":[{",".join(records)}],"events":[{",".join(events)}]}}'
    )
    return body.encode(), len(records), gpus * minutes * 60


def _record(gpu: str, start: int, end: int, state: str, rng: random.Random) -> str:
    n = end - start
    readings = POOLS[n][rng.getrandbits(12)]
    return RECORD.format(gpu=gpu, start=start, end=end, state=state, n=n, readings=readings)


def _event(gpu: str, at: int) -> str:
    return ",".join(
        [
            json.dumps(
                {
                    "event_id": f"{gpu}-{at}-xid",
                    "gpu_uuid": gpu,
                    "at": at,
                    "kind": "xid",
                    "code": 94,
                    "rule": "xid_94_contained_ecc",
                    "detail": {},
                }
            ),
            json.dumps(
                {
                    "event_id": f"{gpu}-{at}-sc",
                    "gpu_uuid": gpu,
                    "at": at,
                    "kind": "state_change",
                    "state": "degraded",
                    "rule": "xid_94_contained_ecc",
                    "detail": {"from": "healthy"},
                }
            ),
        ]
    )


async def run_node(
    client: httpx.AsyncClient,
    node: int,
    token: str,
    args: argparse.Namespace,
    start: int,
    deadline: float,
    stats: Stats,
    in_flight: asyncio.Semaphore,
) -> None:
    """One node: sequential batches, as the agent sends them; at most `concurrency` in flight
    over all nodes, so many nodes share the service as a large fleet would."""
    rng = random.Random(node)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    t = start
    while time.monotonic() < deadline:
        body, n_records, gpu_seconds = batch_body(
            node, args.gpus_per_node, t, args.minutes_per_batch, rng, args.change_rate
        )
        async with in_flight:
            sent = time.perf_counter()
            response = await client.post("/v1/ingest", content=body, headers=headers)
            elapsed = time.perf_counter() - sent
        if response.status_code != 200:
            stats.errors += 1
            print(f"node {node}: {response.status_code} {response.text[:300]}", file=sys.stderr)
            await asyncio.sleep(1)
            continue
        stats.latencies.append(elapsed)
        stats.records += n_records
        stats.gpu_seconds += gpu_seconds
        t += 60 * args.minutes_per_batch


async def progress(stats: Stats, began: float, deadline: float) -> None:
    while time.monotonic() < deadline:
        await asyncio.sleep(5)
        elapsed = time.monotonic() - began
        print(
            f"[{elapsed:5.1f}s] {stats.records / elapsed:,.0f} records/s, "
            f"{len(stats.latencies)} batches, {stats.errors} errors",
            file=sys.stderr,
        )


@dataclass
class Snapshot:
    """Storage and GPU-seconds ingested at one moment of the run."""

    gpu_seconds: int
    stored: int


async def snapshot_later(url: str, stats: Stats, at: float, out: list[Snapshot]) -> None:
    """Measure storage at monotonic time ``at``: growth from there to the end is the steady
    state, past the fixed working set (one open-hour row per GPU) that the first minutes build."""
    await asyncio.sleep(max(0.0, at - time.monotonic()))
    gpu_seconds = stats.gpu_seconds
    stored = sum((await asyncio.to_thread(stored_bytes, url)).values())
    out.append(Snapshot(gpu_seconds, stored))


async def drive(
    base_url: str, url: str, tokens: list[str], args: argparse.Namespace
) -> tuple[Stats, float, Snapshot]:
    stats = Stats()
    mid: list[Snapshot] = []
    hours = int(args.duration * 40_000 / len(tokens) / args.gpus_per_node / 60) + 2
    start = (int(time.time()) // HOUR - hours) * HOUR  # walk forward from `hours` ago
    # A fresh connection per batch, as the agent's urllib uploads do: the kernel then spreads
    # connections over the workers (a few kept-alive ones all landed on one worker).
    limits = httpx.Limits(max_connections=args.concurrency, max_keepalive_connections=0)
    in_flight = asyncio.Semaphore(args.concurrency)
    async with httpx.AsyncClient(base_url=base_url, timeout=60, limits=limits) as client:
        began = time.monotonic()
        deadline = began + args.duration
        await asyncio.gather(
            progress(stats, began, deadline),
            snapshot_later(url, stats, began + args.duration / 3, mid),
            *(
                run_node(client, i, tok, args, start, deadline, stats, in_flight)
                for i, tok in enumerate(tokens)
            ),
        )
        return stats, time.monotonic() - began, mid[0]


def register_nodes(url: str, count: int) -> list[str]:
    from sqlalchemy import create_engine

    from app.fleet.schemas import NodeCreate
    from app.fleet.service import register_node

    engine = create_engine(sqlalchemy_url(url))
    with transaction(engine) as session:
        tokens = [
            register_node(session, NodeCreate(hostname=f"bench-{i}", datacenter="bench"))[1].secret
            for i in range(count)
        ]
    engine.dispose()
    return tokens


def start_service(url: str, workers: int) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {
        **os.environ,
        "GPUMETER_DATABASE_URL": url,
        "GPUMETER_LOG_LEVEL": "warning",
        "GPUMETER_SECRET_KEY": secrets.token_urlsafe(32),
    }
    gpumeter = Path(sys.executable).with_name("gpumeter")
    process = subprocess.Popen(
        [str(gpumeter), "serve", "--port", str(port), "--workers", str(workers)], env=env
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(base, process, timeout_s=30)
    except NotReady:
        stop_child(process, "service")
        raise
    return process, base


def stored_bytes(url: str) -> dict[str, int]:
    return table_bytes(url, TABLES)


def vacuum(url: str) -> None:
    with psycopg.connect(libpq_dsn(url), autocommit=True) as conn:
        conn.execute("VACUUM")


def main() -> int:
    args = parse_args()
    with scratch_database(
        server_from_environment(), "gpumeter_bench_ingest", keep=args.keep_db
    ) as url:
        tokens = register_nodes(url, args.nodes)
        process, base = start_service(url, args.workers)
        try:
            stats, elapsed, mid = asyncio.run(drive(base, url, tokens, args))
        finally:
            stop_child(process, "service")
        sizes = stored_bytes(url)
        vacuum(url)
        print(json.dumps(report(args, stats, elapsed, mid, sizes, stored_bytes(url))))
    return 0


def report(
    args: argparse.Namespace,
    stats: Stats,
    elapsed: float,
    mid: Snapshot,
    sizes: dict[str, int],
    vacuumed: dict[str, int],
) -> dict[str, object]:
    """The final figures: throughput, latency, and storage per GPU-hour."""
    lat = sorted(stats.latencies)
    gpu_hours = stats.gpu_seconds / HOUR
    growth_hours = (stats.gpu_seconds - mid.gpu_seconds) / HOUR
    # Bytes that grow with GPU-hours; the open table holds about one row per GPU (plus dead
    # versions until autovacuum), a working set that does not grow with time.
    marginal = sum(v for t, v in vacuumed.items() if t != "gpu_minute_metrics_open")
    return {
        "records_per_s": round(stats.records / elapsed),
        "gpu_seconds_per_s": round(stats.gpu_seconds / elapsed),
        "p50_ms": round(statistics.median(lat) * 1000, 1),
        "p99_ms": round(lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000, 1),
        # Steady state, everything included (all metering tables with indexes,
        # TOAST, free and dead space; no VACUUM): growth over the last 2/3 of the run.
        "bytes_per_gpu_hour": round((sum(sizes.values()) - mid.stored) / growth_hours),
        # Fixed working set: each GPU's open-hour row, whatever the history length.
        "open_hour_bytes_per_gpu": round(
            sizes["gpu_minute_metrics_open"] / (args.nodes * args.gpus_per_node)
        ),
        # Whole run, working set included: inflated by time compression (each GPU
        # covers only a few hours here, against months in production).
        "bytes_per_gpu_hour_whole_run": round(sum(sizes.values()) / gpu_hours),
        "bytes_per_gpu_hour_after_vacuum": round(sum(vacuumed.values()) / gpu_hours),
        "bytes_per_gpu_hour_excluding_open_hours": round(marginal / gpu_hours),
        "batches": len(lat),
        "errors": stats.errors,
        "records": stats.records,
        "gpu_hours": round(gpu_hours, 1),
        "stored_bytes": sizes,
        "stored_bytes_after_vacuum": vacuumed,
        "gpus": args.nodes * args.gpus_per_node,
        "duration_s": round(elapsed, 1),
        "workers": args.workers,
        "nodes": args.nodes,
        "concurrency": args.concurrency,
        "records_per_batch": args.gpus_per_node * args.minutes_per_batch,
    }


if __name__ == "__main__":
    sys.exit(main())
