"""Ingest's CPU per batch in one process, with no HTTP server and no load generator beside it:
a figure that a busy, shared box moves little (CPU seconds, not wall time).

The service's app (``app.main.create_app``, as a uvicorn worker builds it) is called as an
ASGI app with agent-shaped batches (``bench/ingest.py``'s: 8 GPUs, 2-s records, gzip'd as the
agent sends them), ``--group`` nodes at a time so the group-commit writers store them together
as under load. Two figures, each per batch:

- ``parse_us``: the body's gzip, decode and checks (``IngestEndpoint.parse``), no database;
- ``service_ms`` and ``postgres_ms``: the whole ingest request in this process (key check,
  parse, group commit, statements) and this database's Postgres backends, CPU per batch.

Creates and drops its own database on the server of GPUMETER_DATABASE_URL. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from typing import Any

import ingest as bench  # bench/ingest.py, beside this script
from sqlalchemy import make_url

from app.core.scratch_db import scratch_database, server_from_environment
from app.settings import sqlalchemy_url


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=256, help="simulated nodes (8 GPUs each)")
    p.add_argument("--group", type=int, default=16, help="batches sent at once")
    p.add_argument("--rounds", type=int, default=20, help="upload rounds of every node")
    p.add_argument("--parse-repeats", type=int, default=2000, help="bodies parsed for parse_us")
    p.add_argument(
        "--interval", type=int, default=2, help="seconds a batch carries (the upload interval)"
    )
    return p.parse_args()


class Sent:
    """One ASGI request's body and the status it was answered with."""

    def __init__(self, token: str, body: bytes) -> None:
        self.headers = [
            (b"authorization", f"Bearer {token}".encode()),
            (b"content-type", b"application/json"),
            (b"content-encoding", b"gzip"),
            (b"content-length", str(len(body)).encode()),
        ]
        self.body = body
        self.status = 0

    async def call(self, app: Any) -> None:
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": "/v1/ingest",
            "raw_path": b"/v1/ingest",
            "query_string": b"",
            "root_path": "",
            "headers": self.headers,
            "client": ("127.0.0.1", 1),
            "server": ("127.0.0.1", 80),
            "state": {},
        }
        sent = False

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if sent:
                await asyncio.Event().wait()  # the client stays: no disconnect
            sent = True
            return {"type": "http.request", "body": self.body, "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                self.status = message["status"]

        await app(scope, receive, send)


def bodies(nodes: list[bench.AgentNode], target: bench.Target, rng: random.Random) -> list[Sent]:
    """Every node's next upload, as the agent would send it now."""
    now = target.now()
    out = []
    for node in nodes:
        body, _, _ = node.batch(now, rng)
        out.append(Sent(node.token, target.request(node.token, body, keep_alive=True)))
        out[-1].body = out[-1].body.split(b"\r\n\r\n", 1)[1]  # the gzip'd body alone
    return out


async def drive(app: Any, nodes: list[bench.AgentNode], args: argparse.Namespace) -> dict[str, Any]:
    # The nodes' clock starts back in time and moves --interval s a round, as the agent's uploads:
    # no waiting between rounds (late data is accepted).
    back = args.interval * args.rounds + 30
    target = bench.Target("127.0.0.1", 80, gzip=True, clock_offset_s=-back)
    rng = random.Random(1)
    database = make_url(sqlalchemy_url(os.environ["GPUMETER_DATABASE_URL"])).database
    clock = bench.CpuClock(os.getpid(), database)
    for sent in bodies(nodes, target, rng):  # warm-up: GPUs registered, keys cached
        await sent.call(app)
    used = {"client": 0.0, "postgres": 0.0}
    batches = 0
    for _ in range(args.rounds):
        target.clock_offset_s += args.interval
        round_bodies = bodies(nodes, target, rng)  # made before the clock runs
        before = clock.sample()
        for at in range(0, len(round_bodies), args.group):
            group = round_bodies[at : at + args.group]
            await asyncio.gather(*(sent.call(app) for sent in group))
            bad = [s.status for s in group if s.status != 200]
            if bad:
                raise SystemExit(f"ingest answered {bad}")
        this_round = bench.CpuClock.used(before, clock.sample())
        used = {side: used[side] + this_round[side] for side in used}
        batches += len(round_bodies)
    spent = used["client"] + used["postgres"]
    return {
        "batches": batches,
        "service_ms": round(1000 * used["client"] / batches, 3),
        "postgres_ms": round(1000 * used["postgres"] / batches, 3),
        # GPU-seconds stored per CPU-second of both (no HTTP: bench/ingest.py's is the real one)
        "gpus_per_core": round(batches * bench.AGENT_GPUS * args.interval / spent),
        "parse_us": parse_us(app, nodes, target, rng, args.parse_repeats),
    }


def parse_us(
    app: Any, nodes: list[bench.AgentNode], target: bench.Target, rng: random.Random, n: int
) -> float:
    """CPU microseconds to inflate, decode and check one agent-shaped body."""
    from starlette.datastructures import Headers

    from app.metering.endpoints import IngestEndpoint

    endpoint = IngestEndpoint(app.state.ingest_writers, app.state.settings)
    sample = bodies(nodes[:64], target, rng)
    began = time.process_time()
    for i in range(n):
        sent = sample[i % len(sample)]
        endpoint.parse(Headers(raw=sent.headers), sent.body)
    return round(1e6 * (time.process_time() - began) / n, 1)


def main() -> int:
    args = parse_args()
    with scratch_database(server_from_environment(), "gpumeter_bench_ingest_cpu") as url:
        tokens = bench.register_nodes(url, args.nodes)
        os.environ["GPUMETER_DATABASE_URL"] = url
        os.environ.setdefault("GPUMETER_SECRET_KEY", "bench-" + "x" * 40)
        from app.main import create_app
        from app.settings import get_settings

        get_settings.cache_clear()
        app = create_app(worker=False)
        app.state.settings = get_settings()
        nodes = [bench.AgentNode(i, tok) for i, tok in enumerate(tokens)]
        try:
            figures = asyncio.run(drive(app, nodes, args))
        finally:
            app.state.ingest_writers.close(10.0)
            app.state.engine.dispose()
    print(
        json.dumps(
            {"nodes": args.nodes, "group": args.group, "interval_s": args.interval, **figures}
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
