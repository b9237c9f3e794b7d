"""Helpers for the agent tests: an in-process ingest server and agent process helpers."""

from __future__ import annotations

import gzip
import itertools
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from metering_agent.protocol import INGEST_PATH

REPO = Path(__file__).resolve().parents[2]
T0 = 1_700_000_020  # 40 s into a minute


class FakeClock:
    """Wall and monotonic clocks that move only when slept on; ``jumps`` shift the wall clock."""

    def __init__(self, wall: float = T0 + 0.5) -> None:
        self._wall, self._mono = wall, 100.0
        self.jumps: dict[int, float] = {}  # after this many sleeps -> wall-clock shift
        self.sleeps = 0

    def wall(self) -> float:
        return self._wall

    def mono(self) -> float:
        return self._mono

    def sleep(self, seconds: float, stop: threading.Event) -> None:
        self._wall += seconds
        self._mono += seconds
        self.sleeps += 1
        self._wall += self.jumps.pop(self.sleeps, 0.0)


@dataclass
class Sink:
    """Records every batch POSTed to it; ``script`` scripts the next replies.

    Script items: an HTTP status (``500``, ``400``, ...), ``(status, {header: value})``, a
    callable returning one of those (evaluated when the request arrives), or
    ``("sleep", seconds)`` to answer 200 only after sleeping (past the client's timeout), or
    ``"drop_after"`` to answer 200 and then close the kept-alive connection unannounced, or
    ``("answer", {...})`` to answer 200 with that JSON body (a real service's answer). Once
    the script is used up: ``down`` (a status) while it is set, else 200.
    """

    url: str = ""
    script: list[Any] = field(default_factory=list)
    down: int | None = None
    stored: list[dict[str, Any]] = field(default_factory=list)  # batches answered 2xx
    requests: int = 0
    request_times: list[float] = field(default_factory=list)  # monotonic, on arrival
    tokens: set[str] = field(default_factory=set)
    connections: int = 0  # TCP connections the agent opened (kept alive: HTTP/1.1)
    encodings: list[str] = field(default_factory=list)  # each request's Content-Encoding
    arrivals: list[float] = field(default_factory=list)  # wall clock, per stored batch
    lock: threading.Lock = field(default_factory=threading.Lock)

    def next_reply(self) -> Any:
        with self.lock:
            self.requests += 1
            self.request_times.append(time.monotonic())
            action = self.script.pop(0) if self.script else (self.down or 200)
        return action() if callable(action) else action

    def records(self) -> dict[tuple[str, int], dict[str, Any]]:
        """Records after dedupe by (gpu_uuid, start), like the real service."""
        with self.lock:
            return {(r["gpu_uuid"], r["start"]): r for b in self.stored for r in b["records"]}

    def all_records(self) -> list[dict[str, Any]]:
        with self.lock:
            return [r for b in self.stored for r in b["records"]]

    def events(self) -> list[dict[str, Any]]:
        with self.lock:
            return [e for b in self.stored for e in b["events"]]


def serve_sink() -> tuple[Sink, ThreadingHTTPServer]:
    state = Sink()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keeps connections alive, like the service

        def setup(self) -> None:
            super().setup()
            with state.lock:
                state.connections += 1

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            encoding = self.headers.get("Content-Encoding", "identity")
            if encoding == "gzip":
                body = gzip.decompress(body)
            with state.lock:
                state.tokens.add(self.headers.get("Authorization", ""))
                state.encodings.append(encoding)
            action, headers = state.next_reply(), {}
            answer: dict[str, Any] = {"ok": True}
            if isinstance(action, tuple) and action[0] == "answer":
                answer = action[1]
                action = 200
            elif isinstance(action, tuple) and action[0] == "sleep":
                time.sleep(action[1])
                action = 200
            elif action == "drop_after":  # answer, then close without saying so (idle timeout)
                self.close_connection, action = True, 200
            elif isinstance(action, tuple):
                action, headers = action
            if self.path != INGEST_PATH:
                action = 404
            if action == 200:
                with state.lock:
                    state.stored.append(json.loads(body))
                    state.arrivals.append(time.time())
            reply = json.dumps({"detail": "scripted"} if action != 200 else answer)
            self.send_response(action)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(reply)))
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(reply.encode())

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return state, server


def agent_cmd(sink: Sink, spool: Path, *args: str) -> list[str]:
    return [
        sys.executable, "-m", "metering_agent",
        "--server", sink.url, "--token", "node-token", "--spool-dir", str(spool),
        "--node-name", "test-node", "--upload-interval", "1", "--upload-timeout", "2",
        "--backoff-max", "1", *args,
    ]  # fmt: skip


def start_agent(sink: Sink, spool: Path, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        agent_cmd(sink, spool, *args),
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def metrics_page(port: int, timeout_s: float = 2) -> bytes | None:
    """The agent's /metrics page; None while it does not answer. The response is closed
    here (left open, its socket is a ResourceWarning at a later garbage collection)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout_s) as r:
            return bytes(r.read())
    except OSError:
        return None


def scrape(port: int) -> dict[str, float]:
    """The agent's /metrics as {series: value}; empty while it does not answer."""
    text = metrics_page(port)
    if text is None:
        return {}
    return {
        name: float(value)
        for name, _, value in (line.rpartition(" ") for line in text.decode().splitlines())
        if name and not name.startswith("#")
    }


def log_events(stderr: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]


def assert_no_overlap(records: list[dict[str, Any]]) -> dict[str, list[tuple[int, int]]]:
    """Per GPU, the deduplicated records' intervals are disjoint; returns them sorted."""
    spans: dict[str, list[tuple[int, int]]] = {}
    for r in {(r["gpu_uuid"], r["start"]): r for r in records}.values():
        assert r["start"] < r["end"] and r["sample_count"] == r["end"] - r["start"]
        assert r["start"] // 60 == (r["end"] - 1) // 60, f"crosses a minute: {r}"
        spans.setdefault(r["gpu_uuid"], []).append((r["start"], r["end"]))
    for gpu, intervals in spans.items():
        intervals.sort()
        for (_, end), (start, _) in itertools.pairwise(intervals):
            assert end <= start, f"{gpu}: overlapping records {intervals}"
    return spans
