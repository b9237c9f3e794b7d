"""Overload benchmark: `gpumeter serve` must shed (503 + Retry-After), never wedge.

1. quiet: a low open-loop rate gives the quiet p99;
2. sustainable: closed-loop at the service's in-flight bound, the rate it sustains;
3. overload: open-loop at 3x that rate for ``--overload-s``: 8-record batches, each from the
   next of many distinct nodes; a 503 (or a client timeout) is re-sent after ``Retry-After``,
   as the agent does; every batch is re-sent until it is answered 200;
4. recovery: back at the quiet rate, the seconds until a 1 s window's p99 is at most twice the
   quiet p99 again;
5. every GPU-second answered 200 must be in the database (accepted-seconds lost must be 0);
6. SIGTERM under a fresh overload burst: seconds until the service has exited.

Prints progress on stderr and one final JSON line. Reuses the ingest bench's harness (scratch
database, node registration, ``gpumeter serve``, batch builder).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field

import httpx
import psycopg
from ingest import batch_body, register_nodes, start_service

from app.core.scratch_db import libpq_dsn, scratch_database, server_from_environment

GPUS_PER_BATCH = 8
CLIENT_TIMEOUT_S = 10.0
CLIENT_CONNECTIONS = 400


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=2, help="uvicorn workers")
    p.add_argument("--nodes", type=int, default=400, help="distinct nodes sending")
    p.add_argument("--overload-s", type=float, default=60.0, help="seconds at 3x")
    p.add_argument("--factor", type=float, default=3.0, help="overload / sustainable rate")
    p.add_argument("--quiet-rps", type=float, default=5.0, help="the quiet rate")
    return p.parse_args()


@dataclass
class Node:
    """One node's agent: its next batch, re-sent until it is answered 200."""

    index: int
    token: str
    cursor: int
    rng: random.Random
    pending: bytes | None = None
    busy: bool = False

    def body(self) -> bytes:
        if self.pending is None:
            self.pending = batch_body(self.index, GPUS_PER_BATCH, self.cursor, 1, self.rng, 0)[0]
        return self.pending

    def stored(self) -> None:
        self.pending, self.cursor = None, self.cursor + 60


@dataclass
class Load:
    nodes: list[Node]
    statuses: dict[str, int] = field(default_factory=dict)
    accepted_s: int = 0
    answered: list[tuple[float, float]] = field(default_factory=list)  # (when, latency) of 200s
    retry_at: dict[int, float] = field(default_factory=dict)
    next_node: int = 0

    def count(self, status: str) -> None:
        self.statuses[status] = self.statuses.get(status, 0) + 1

    def idle_node(self) -> Node | None:
        now = time.monotonic()
        for _ in range(len(self.nodes)):
            node = self.nodes[self.next_node]
            self.next_node = (self.next_node + 1) % len(self.nodes)
            if not node.busy and self.retry_at.get(node.index, 0) <= now:
                node.busy = True  # taken now: a second pick before its task runs must skip it
                return node
        return None


async def send(client: httpx.AsyncClient, load: Load, node: Node) -> None:
    """One attempt at the node's pending batch (the node was marked busy by whoever chose it)."""
    headers = {"Authorization": f"Bearer {node.token}", "Content-Type": "application/json"}
    sent = time.monotonic()
    try:
        response = await client.post("/v1/ingest", content=node.body(), headers=headers)
    except httpx.TransportError as error:  # a timeout or a dropped connection: re-send later
        load.count(type(error).__name__)
        load.retry_at[node.index] = time.monotonic() + 1
    else:
        load.count(str(response.status_code))
        if response.status_code == 200:
            load.accepted_s += GPUS_PER_BATCH * 60
            load.answered.append((time.monotonic(), time.monotonic() - sent))
            node.stored()
        else:
            if response.status_code != 503:
                print(f"{response.status_code}: {response.text[:300]}", file=sys.stderr)
            wait = float(response.headers.get("retry-after", 1))
            load.retry_at[node.index] = time.monotonic() + wait * random.uniform(1, 2)
    finally:
        node.busy = False


async def open_loop(client: httpx.AsyncClient, load: Load, rps: float, seconds: float) -> None:
    """Start a request every 1/rps s whatever the answers, as a fleet of agents does."""
    tasks: set[asyncio.Task[None]] = set()
    began = time.monotonic()
    started = 0
    while (now := time.monotonic()) < began + seconds:
        due = int((now - began) * rps) - started
        for _ in range(due):
            node = load.idle_node()
            if node is not None:
                task = asyncio.create_task(send(client, load, node))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            started += 1
        await asyncio.sleep(0.005)
    if tasks:
        await asyncio.gather(*tasks)


async def closed_loop(client: httpx.AsyncClient, load: Load, width: int, seconds: float) -> float:
    """Requests/s answered 200 with ``width`` always in flight: the sustainable rate."""
    deadline = time.monotonic() + seconds
    before = len(load.answered)

    async def lane() -> None:
        while time.monotonic() < deadline:
            node = load.idle_node()
            if node is None:
                await asyncio.sleep(0.01)
                continue
            await send(client, load, node)

    await asyncio.gather(*(lane() for _ in range(width)))
    return (len(load.answered) - before) / seconds


def p99(latencies: list[float]) -> float:
    return statistics.quantiles(latencies, n=100)[98] if len(latencies) >= 2 else 0.0


async def recovery_s(client: httpx.AsyncClient, load: Load, rps: float, quiet: float) -> float:
    """Seconds after the overload ends until a 1 s window's p99 is within 2x the quiet p99."""
    ended = time.monotonic()
    task = asyncio.create_task(open_loop(client, load, rps, 60))
    try:
        while time.monotonic() < ended + 60:
            await asyncio.sleep(1)
            now = time.monotonic()
            window = [lat for at, lat in load.answered if now - 1 <= at <= now]
            if window and p99(window + window) <= 2 * quiet:
                return now - ended
        return float("inf")
    finally:
        task.cancel()


async def drain(client: httpx.AsyncClient, load: Load) -> None:
    """Re-send every batch not yet answered 200 (the shed and the timed out)."""
    while pending := [n for n in load.nodes if n.pending is not None and not n.busy][:16]:
        for node in pending:
            node.busy = True
        await asyncio.gather(*(send(client, load, n) for n in pending))


def stored_seconds(url: str) -> int:
    with psycopg.connect(libpq_dsn(url)) as conn:
        row = conn.execute('SELECT coalesce(sum("end" - start), 0) FROM gpu_state_segments')
        return int(row.fetchone()[0])  # type: ignore[index]


async def run(base: str, url: str, tokens: list[str], args: argparse.Namespace) -> Figures:
    start = int(time.time()) // 3600 * 3600 - 24 * 3600
    rng = random.Random(0)
    nodes = [Node(i, t, start, random.Random(rng.random())) for i, t in enumerate(tokens)]
    load = Load(nodes)
    # A fresh connection per batch, as the agent's uploads; at most CLIENT_CONNECTIONS open
    # (more only starve this process's own event loop on a small machine).
    limits = httpx.Limits(max_connections=CLIENT_CONNECTIONS, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=base, timeout=CLIENT_TIMEOUT_S, limits=limits) as client:
        await open_loop(client, load, args.quiet_rps, 5)
        quiet = p99([lat for _, lat in load.answered])
        sustainable = await closed_loop(client, load, 20 * args.workers, 10)
        print(f"quiet p99 {quiet * 1000:.0f} ms, sustainable {sustainable:.0f}/s", file=sys.stderr)
        before = dict(load.statuses)
        await open_loop(client, load, args.factor * sustainable, args.overload_s)
        during = {k: v - before.get(k, 0) for k, v in load.statuses.items()}
        print(f"overload statuses {during}", file=sys.stderr)
        recovered = await recovery_s(client, load, args.quiet_rps, quiet)
        await drain(client, load)
    return Figures(
        quiet_p99_ms=round(quiet * 1000, 1),
        sustainable_rps=round(sustainable, 1),
        overload_rps=round(args.factor * sustainable, 1),
        overload_statuses=during,
        shed_503=load.statuses.get("503", 0),
        other_5xx=sum(v for k, v in load.statuses.items() if k.startswith("5") and k != "503"),
        accepted_seconds_lost=load.accepted_s - stored_seconds(url),
        recovery_s=round(recovered, 1),
        workers=args.workers,
    )


@dataclass
class Figures:
    quiet_p99_ms: float
    sustainable_rps: float
    overload_rps: float
    overload_statuses: dict[str, int]
    shed_503: int
    other_5xx: int
    accepted_seconds_lost: int
    recovery_s: float
    workers: int
    sigterm_s: float = float("nan")

    def ok(self) -> bool:
        return (
            self.other_5xx == 0
            and self.accepted_seconds_lost == 0
            and self.recovery_s <= 10
            and self.sigterm_s <= 10
        )


async def burst(base: str, tokens: list[str], rps: float, seconds: float) -> None:
    nodes = [
        Node(i, t, int(time.time()) // 60 * 60 - 7200, random.Random(i))
        for i, t in enumerate(tokens)
    ]
    async with httpx.AsyncClient(base_url=base, timeout=CLIENT_TIMEOUT_S) as client:
        await open_loop(client, Load(nodes), rps, seconds)


def sigterm_s(process: subprocess.Popen[bytes], base: str, tokens: list[str], rps: float) -> float:
    """Send SIGTERM 3 s into an overload burst; seconds until the service exited."""
    loader = threading.Thread(target=lambda: asyncio.run(burst(base, tokens, rps, 6)), daemon=True)
    loader.start()
    time.sleep(3)
    sent = time.monotonic()
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        return float("inf")
    return time.monotonic() - sent


def main() -> int:
    args = parse_args()
    with scratch_database(server_from_environment(), "gpumeter_overload") as url:
        tokens = register_nodes(url, args.nodes)
        process, base = start_service(url, args.workers)
        try:
            figures = asyncio.run(run(base, url, tokens, args))
            overload = args.factor * figures.sustainable_rps
            figures.sigterm_s = round(sigterm_s(process, base, tokens, overload), 1)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    print(json.dumps(asdict(figures)))
    return 0 if figures.ok() else 1


if __name__ == "__main__":
    sys.exit(main())
