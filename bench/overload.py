"""Overload benchmark: `gpumeter serve` must shed (503 + Retry-After), never wedge.

1. warm-up: every node's first batch (it registers the node's GPUs), so the phases send
   steady batches;
2. quiet: a low open-loop rate gives the quiet p99;
3. sustainable: the database analysed (``VACUUM ANALYZE``: the statistics of a fleet's tables,
   which autovacuum gives a running service) and warmed by ``--warm-s`` of closed-loop load, then
   closed-loop at the service's ingest in-flight bound for ``--sustainable-s``: the rate it
   sustains (measured on the cold, unanalysed tables it was half what the overload then got);
4. overload: open-loop at ``--factor`` times that for ``--overload-s``: a request is due every
   1/rate s whatever the answers, each from the next node with nothing in flight (8-record
   batches); a 503 (or a client timeout) leaves the batch to be re-sent after ``Retry-After``,
   as the agent does, and every batch is re-sent until it is answered 200;
5. recovery: back at the quiet rate, the seconds from the overload's end until a 1 s window's
   p99 is at most twice the quiet p99 again;
6. every GPU-second answered 200 must be in the database, and nothing else;
7. SIGTERM 3 s into a fresh overload burst: seconds until the service has exited.

The load comes from ``--senders`` processes (forked; each owns a share of the nodes and runs
raw HTTP/1.1 on asyncio sockets, one kept-alive connection per node), so that the generator is
not what limits the offered rate. Each reports what was due (``asked``), what it actually
wrote to a socket (``sent``: a due request with no idle node is ``unsent``) and every answer.
The run fails (exit 1, a ``FAIL`` line per reason) when the load was not offered (sent under
97 % of asked, or requests left more than 0.5 s after they were due), when the service was
not overloaded (no 503, or it answered 200 to as many as were sent), on any other 5xx, lost or
extra GPU-seconds, recovery or exit over 10 s, or nothing in flight when SIGTERM came.

Prints progress on stderr and one final JSON line. Reuses the ingest bench's harness (scratch
database, node registration, ``gpumeter serve``, batch builder, request framing).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import random
import resource
import signal
import statistics
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import psycopg
from ingest import Target, batch_body, register_nodes, start_service, vacuum

from app.core.processes import stop_child
from app.core.scratch_db import libpq_dsn, scratch_database, server_from_environment
from app.settings import Settings

GPUS_PER_BATCH = 8
SECONDS_PER_BATCH = 60
CLIENT_TIMEOUT_S = 10.0
SENT_SHARE_MIN = 0.97  # of the due requests, the share that must have been sent
SEND_LAG_MAX_S = 0.5  # the 99th percentile of (sent - due) must stay under this
LIMIT_S = 10.0  # recovery and SIGTERM
RECOVERY_MAX_S = 30.0
RETRY_WAIT_MAX_S = 2.0  # Retry-After (1 s) jittered up to twice, or 1 s after a transport error


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=2, help="uvicorn workers")
    p.add_argument(
        "--nodes",
        type=int,
        default=8000,
        help="distinct nodes sending (one request in flight each: enough for the offered rate "
        "times the longest answer plus Retry-After)",
    )
    p.add_argument("--senders", type=int, default=4, help="load generator processes")
    p.add_argument("--overload-s", type=float, default=60.0, help="seconds at --factor")
    p.add_argument("--factor", type=float, default=3.0, help="overload / sustainable rate")
    p.add_argument("--quiet-rps", type=float, default=5.0, help="the quiet rate")
    p.add_argument(
        "--warm-s", type=float, default=10.0, help="closed-loop seconds before sustainable"
    )
    p.add_argument("--sustainable-s", type=float, default=10.0, help="seconds measured")
    return p.parse_args()


# --- one sender process -----------------------------------------------------------------


@dataclass
class Node:
    """One node's agent: its pending batch (re-sent until answered 200), its connection."""

    index: int
    token: str
    cursor: int
    rng: random.Random
    pending: bytes | None = None
    tries: int = 0
    reader: asyncio.StreamReader | None = None
    writer: asyncio.StreamWriter | None = None

    def payload(self, target: Target) -> bytes:
        if self.pending is None:
            body = batch_body(self.index, GPUS_PER_BATCH, self.cursor, 1, self.rng, 0)[0]
            self.pending = target.request(self.token, body, keep_alive=True)
        return self.pending

    def stored(self) -> None:
        self.pending, self.tries = None, 0
        self.cursor += SECONDS_PER_BATCH


@dataclass
class Tally:
    """What one or more senders saw during one command."""

    asked: int = 0  # requests due by the schedule (open loop) or by a free lane (closed)
    sent: int = 0  # requests written to a socket, re-sends included
    resent: int = 0  # of ``sent``, batches sent before and not yet answered 200
    unsent: int = 0  # due, but every node was waiting on an answer or a Retry-After
    statuses: dict[str, int] = field(default_factory=dict)
    answered: list[tuple[float, float, int]] = field(default_factory=list)  # when, latency, status
    lags: list[float] = field(default_factory=list)  # seconds each sent request left late
    accepted_s: int = 0
    in_flight_at_probe: int = 0
    sent_by_probe: int = 0
    cpu_s: float = 0.0

    def count(self, status: str) -> None:
        self.statuses[status] = self.statuses.get(status, 0) + 1

    def merge(self, other: Tally) -> None:
        for name in ("asked", "sent", "resent", "unsent", "accepted_s", "cpu_s"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.in_flight_at_probe += other.in_flight_at_probe
        self.sent_by_probe += other.sent_by_probe
        for status, n in other.statuses.items():
            self.statuses[status] = self.statuses.get(status, 0) + n
        self.answered += other.answered
        self.lags += other.lags

    def ok_latencies(self) -> list[float]:
        return [latency for _, latency, status in self.answered if status == 200]


class Sender:
    """A share of the nodes, sending on its own event loop; nodes free to send wait in
    ``ready`` (a node re-enters it when answered, or after Retry-After when shed)."""

    def __init__(self, nodes: list[Node], target: Target) -> None:
        self.nodes, self.target = nodes, target
        self.ready: deque[Node] = deque(nodes)
        self.in_flight = 0
        self.tally = Tally()

    async def attempt(self, node: Node, due: float) -> None:
        """One request with the node's pending batch; the node is ready again when answered
        200, or once the wait ``request`` says is over."""
        wait = await self.request(node, due)
        if wait:
            asyncio.get_running_loop().call_later(wait, self.ready.append, node)
        else:
            self.ready.append(node)

    async def request(self, node: Node, due: float) -> float:
        """Send the node's pending batch and tally it; the seconds to wait before re-sending
        it: 0 when answered 200, Retry-After (jittered) when shed, 1 after a transport error."""
        payload = node.payload(self.target)
        now = time.monotonic()
        tally = self.tally
        tally.sent += 1
        tally.resent += node.tries > 0
        tally.lags.append(now - due)
        node.tries += 1
        self.in_flight += 1
        try:
            status, retry_after = await self.exchange(node, payload)
        except (OSError, asyncio.IncompleteReadError, ValueError) as error:  # timeouts too
            await self.close(node)
            tally.count(type(error).__name__)
            return 1.0
        finally:
            self.in_flight -= 1
        answered = time.monotonic()
        tally.count(str(status))
        tally.answered.append((answered, answered - now, status))
        if status == 200:
            tally.accepted_s += GPUS_PER_BATCH * SECONDS_PER_BATCH
            node.stored()
            return 0.0
        if status != 503:
            print(f"sender: unexpected {status}", file=sys.stderr)
        return retry_after * random.uniform(1, 2)

    async def exchange(self, node: Node, payload: bytes) -> tuple[int, float]:
        """Send on the node's kept-alive connection; a connection the server closed while
        idle is reopened once. (status, Retry-After seconds)."""
        for reuse in (node.writer is not None, False):
            if node.writer is None:
                node.reader, node.writer = await asyncio.open_connection(
                    self.target.host, self.target.port
                )
            assert node.reader is not None
            try:
                async with asyncio.timeout(CLIENT_TIMEOUT_S):
                    node.writer.write(payload)
                    head = await node.reader.readuntil(b"\r\n\r\n")
                    lower = head.lower()
                    length = int(_header(lower, b"content-length") or 0)
                    await node.reader.readexactly(length)
            except (OSError, asyncio.IncompleteReadError) as error:
                await self.close(node)
                if reuse and not isinstance(error, TimeoutError):
                    continue
                raise
            if b"connection: close" in lower:
                await self.close(node)
            return int(head[9:12]), float(_header(lower, b"retry-after") or 1)
        raise AssertionError("unreachable")

    @staticmethod
    async def close(node: Node) -> None:
        if node.writer is not None:
            node.writer.close()
            with contextlib.suppress(OSError):
                await node.writer.wait_closed()
        node.reader = node.writer = None

    async def open_loop(self, rps: float, seconds: float, start_at: float, probe_at: float) -> None:
        """A request due every 1/rps s from ``start_at`` whatever the answers; one that finds
        no ready node is counted unsent. At ``probe_at`` (if in the run) the requests in flight
        and sent so far are noted. Returns when the last answer is in."""
        tasks: set[asyncio.Task[None]] = set()
        loop = asyncio.get_running_loop()
        if start_at <= probe_at < start_at + seconds:
            loop.call_at(probe_at, self.probe)  # the loop's clock is time.monotonic()
        await asyncio.sleep(max(0.0, start_at - time.monotonic()))
        asked = 0
        while (now := time.monotonic()) < start_at + seconds:
            due_count = int((now - start_at) * rps) - asked
            for k in range(due_count):
                asked += 1
                due = start_at + (asked - 1) / rps
                if not self.ready:
                    self.tally.unsent += 1
                    continue
                task = asyncio.create_task(self.attempt(self.ready.popleft(), due))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                if k % 64 == 63:
                    await asyncio.sleep(0)  # let answers in while catching up
            await asyncio.sleep(0.002)
        self.tally.asked += asked
        if tasks:
            await asyncio.gather(*tasks)

    def probe(self) -> None:
        self.tally.in_flight_at_probe = self.in_flight
        self.tally.sent_by_probe = self.tally.sent

    async def closed_loop(self, width: float, seconds: float, start_at: float) -> None:
        """``width`` lanes, each sending the next ready node's batch as soon as its last
        request was answered."""
        await asyncio.sleep(max(0.0, start_at - time.monotonic()))
        deadline = start_at + seconds

        async def lane() -> None:
            while (now := time.monotonic()) < deadline:
                if not self.ready:
                    await asyncio.sleep(0.01)
                    continue
                self.tally.asked += 1
                await self.attempt(self.ready.popleft(), now)

        await asyncio.gather(*(lane() for _ in range(round(width))))

    async def drain(self) -> None:
        """Re-send every batch not yet answered 200 (the shed and the timed out), 32 at a
        time, each until it is; first the Retry-After waits run out (their nodes rejoin
        ``ready``)."""
        await asyncio.sleep(2 * RETRY_WAIT_MAX_S)
        await self.until_stored([n for n in self.nodes if n.pending is not None], 32)

    async def warm(self) -> None:
        """Each node's first batch (it registers the node's GPUs), 16 at a time."""
        await self.until_stored(self.nodes, 16)

    async def until_stored(self, nodes: list[Node], width: int) -> None:
        queue = deque(nodes)

        async def lane() -> None:
            while queue:
                node = queue.popleft()
                while wait := await self.request(node, time.monotonic()):
                    await asyncio.sleep(wait)

        await asyncio.gather(*(lane() for _ in range(width)))

    async def close_all(self) -> None:
        for node in self.nodes:
            await self.close(node)


def _header(head: bytes, name: bytes) -> bytes | None:
    at = head.find(b"\r\n" + name + b":")
    if at < 0:
        return None
    at += len(name) + 3
    return head[at : head.index(b"\r\n", at)].strip()


def sender_main(conn: Connection, nodes: list[Node], target: Target) -> None:
    """Run commands from the parent until ``stop``; answer each with its Tally."""
    sender = Sender(nodes, target)
    with asyncio.Runner() as runner:
        while True:
            command, *args = conn.recv()
            if command == "stop":
                runner.run(sender.close_all())
                return
            sender.tally = Tally()
            cpu = _cpu_s()
            runner.run(getattr(sender, command)(*args))
            sender.tally.cpu_s = _cpu_s() - cpu
            conn.send(sender.tally)


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# --- the parent: phases and checks ------------------------------------------------------


class Senders:
    """The sender processes; each command runs in all of them at once."""

    def __init__(self, count: int, tokens: list[str], base: str) -> None:
        host, port = base.removeprefix("http://").split(":")
        target = Target(host, int(port), gzip=False)  # bulk-shaped bodies, not the agent's
        start = int(time.time()) // 3600 * 3600 - 24 * 3600
        rng = random.Random(0)
        nodes = [Node(i, t, start, random.Random(rng.random())) for i, t in enumerate(tokens)]
        context = multiprocessing.get_context("fork")
        self.conns: list[Connection] = []
        self.processes = []
        for k in range(count):
            parent, child = context.Pipe()
            process = context.Process(
                target=sender_main, args=(child, nodes[k::count], target), daemon=True
            )
            process.start()
            self.conns.append(parent)
            self.processes.append(process)

    def run(self, command: str, *args: Any, split: bool = False) -> Tally:
        """Run ``command`` in every sender (``split``: its first argument, a rate or a
        width, shared out among them) and sum what they saw."""
        for conn in self.conns:
            share = (args[0] / len(self.conns),) if split else args[:1]
            conn.send((command, *share, *args[1:]))
        total = Tally()
        for conn in self.conns:
            total.merge(conn.recv())
        return total

    def stop(self) -> None:
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.send(("stop",))
        for process in self.processes:
            process.join(30)
            if process.is_alive():
                process.kill()


def p99(latencies: list[float]) -> float:
    if not latencies:
        return float("inf")
    return statistics.quantiles(latencies, n=100)[98] if len(latencies) >= 2 else latencies[0]


def first_recovered(answered: list[tuple[float, float, int]], since: float, bound: float) -> float:
    """Seconds after ``since`` at which a 1 s window of 200s first had p99 <= ``bound``."""
    ok = sorted((at, latency) for at, latency, status in answered if status == 200)
    for at, _ in ok:
        window = [latency for t, latency in ok if at - 1 <= t <= at]
        if at - 1 >= since and p99(window) <= bound:
            return at - since
    return float("inf")


def stored_seconds(url: str) -> int:
    with psycopg.connect(libpq_dsn(url)) as conn:
        row = conn.execute('SELECT coalesce(sum("end" - start), 0) FROM gpu_state_segments')
        return int(row.fetchone()[0])  # type: ignore[index]


def rps(n: int, seconds: float) -> float:
    return round(n / seconds, 1)


def overload_figures(tally: Tally, seconds: float) -> dict[str, Any]:
    lags = sorted(tally.lags)
    return {
        "asked_rps": rps(tally.asked, seconds),
        "sent_rps": rps(tally.sent, seconds),
        "sent_share": round(tally.sent / tally.asked, 3) if tally.asked else 0.0,
        "resent": tally.resent,
        "unsent": tally.unsent,
        "send_lag_p99_ms": round(lags[int(0.99 * (len(lags) - 1))] * 1000, 1) if lags else None,
        "answered_200_rps": rps(tally.statuses.get("200", 0), seconds),
        "statuses": tally.statuses,
        "client_cores": round(tally.cpu_s / seconds, 2),
    }


def run(url: str, tokens: list[str], args: argparse.Namespace) -> dict[str, Any]:
    width = args.workers * Settings().ingest_in_flight  # the service's own bound
    process, base = start_service(url, args.workers)
    senders = Senders(args.senders, tokens, base)
    try:
        warm = senders.run("warm")
        print(f"warm-up: {len(tokens)} nodes' first batches stored", file=sys.stderr)
        now = time.monotonic() + 0.2
        quiet_tally = senders.run("open_loop", args.quiet_rps, 5.0, now, 0.0, split=True)
        quiet = p99(quiet_tally.ok_latencies())
        vacuum(url, analyze=True)
        warmed = senders.run("closed_loop", width, args.warm_s, time.monotonic() + 0.2, split=True)
        seconds = args.sustainable_s
        sus = senders.run("closed_loop", width, seconds, time.monotonic() + 0.2, split=True)
        sustainable = sus.statuses.get("200", 0) / seconds
        print(
            f"quiet p99 {quiet * 1000:.0f} ms; sustainable {sustainable:.0f}/s "
            f"({width} in flight, statuses {sus.statuses})",
            file=sys.stderr,
        )
        offered = args.factor * sustainable
        start = time.monotonic() + 0.2
        over = senders.run("open_loop", offered, args.overload_s, start, 0.0, split=True)
        overload = overload_figures(over, args.overload_s)
        print(f"overload: {json.dumps(overload)}", file=sys.stderr)
        ended = start + args.overload_s
        recovery = Tally()
        recovered = float("inf")
        while time.monotonic() < ended + RECOVERY_MAX_S and recovered == float("inf"):
            chunk = senders.run("open_loop", args.quiet_rps, 2.0, time.monotonic(), 0.0, split=True)
            recovery.merge(chunk)
            recovered = first_recovered(recovery.answered, ended, 2 * quiet)
        drained = senders.run("drain")
        phases = (warm, quiet_tally, warmed, sus, over, recovery, drained)
        accepted = sum(t.accepted_s for t in phases)
        stored = stored_seconds(url)
        burst_start = time.monotonic() + 0.5
        sigterm_at = burst_start + 3.0
        sigterm = sigterm_s(senders, process, offered, burst_start, sigterm_at)
    finally:
        senders.stop()
        stop_child(process, "service")  # SIGTERM first: a SIGKILLed parent orphans its workers
    return {
        "workers": args.workers,
        "senders": args.senders,
        "nodes": len(tokens),
        "quiet_p99_ms": round(quiet * 1000, 1),
        "sustainable_rps": round(sustainable, 1),
        "sustainable_width": width,
        "sustainable_statuses": sus.statuses,
        "overload": overload,
        "shed_503": over.statuses.get("503", 0),
        "other_5xx": sum(
            v for t in phases for k, v in t.statuses.items() if k.startswith("5") and k != "503"
        ),
        "accepted_gpu_seconds": accepted,
        "stored_gpu_seconds": stored,
        "recovery_s": round(recovered, 1),
        **sigterm,
    }


def sigterm_s(
    senders: Senders,
    process: subprocess.Popen[bytes],
    offered: float,
    start: float,
    at: float,
) -> dict[str, Any]:
    """SIGTERM at ``at``, 3 s into an overload burst from ``start``: seconds until the
    service exited, and what was in flight then."""
    import threading

    out: list[Tally] = []
    loader = threading.Thread(
        target=lambda: out.append(senders.run("open_loop", offered, 6.0, start, at, split=True))
    )
    loader.start()
    time.sleep(max(0.0, at - time.monotonic()))
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(60)
        exited = time.monotonic() - at
    except subprocess.TimeoutExpired:
        exited = float("inf")
    loader.join(60)
    burst = out[0] if out else Tally()
    return {
        "sigterm_s": round(exited, 1),
        "sigterm_in_flight": burst.in_flight_at_probe,
        "sigterm_sent_before": burst.sent_by_probe,
        "sigterm_asked_before": round(offered * (at - start)),
    }


def failures(figures: dict[str, Any]) -> list[str]:
    """Each reason the run failed, in words."""
    out = []
    over = figures["overload"]
    if over["sent_share"] < SENT_SHARE_MIN:
        out.append(
            f"the load was not offered: {over['sent_rps']}/s sent of {over['asked_rps']}/s asked "
            f"({over['unsent']} due with no idle node: raise --nodes)"
        )
    if over["send_lag_p99_ms"] is None or over["send_lag_p99_ms"] > SEND_LAG_MAX_S * 1000:
        out.append(
            f"the generator fell behind: p99 send lag {over['send_lag_p99_ms']} ms "
            "(raise --senders, or the machine is too busy)"
        )
    if figures["shed_503"] == 0:
        out.append("no shedding: the service answered no 503 under overload")
    if over["answered_200_rps"] >= over["sent_rps"]:
        out.append("not overloaded: the service answered 200 to everything sent")
    if figures["other_5xx"]:
        out.append(f"{figures['other_5xx']} answers 5xx other than 503")
    if figures["accepted_gpu_seconds"] != figures["stored_gpu_seconds"]:
        out.append(
            f"{figures['accepted_gpu_seconds']} GPU-seconds answered 200 but "
            f"{figures['stored_gpu_seconds']} stored"
        )
    if not figures["recovery_s"] <= LIMIT_S:
        out.append(f"recovery took {figures['recovery_s']} s (limit {LIMIT_S:.0f} s)")
    if not figures["sigterm_s"] <= LIMIT_S:
        out.append(f"exit after SIGTERM took {figures['sigterm_s']} s (limit {LIMIT_S:.0f} s)")
    if figures["sigterm_in_flight"] == 0:
        out.append("nothing was in flight when SIGTERM came: the exit was not under load")
    return out


def main() -> int:
    args = parse_args()
    with scratch_database(server_from_environment(), "gpumeter_overload") as url:
        tokens = register_nodes(url, args.nodes)
        figures = run(url, tokens, args)
    failed = failures(figures)
    for reason in failed:
        print(f"FAIL: {reason}", file=sys.stderr)
    print(json.dumps({**figures, "failures": failed, "pass": not failed}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
