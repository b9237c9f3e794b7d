"""Event-to-delivery latency of webhooks: from an event's commit to a signed request arriving.

A fresh database, one real `gpumeter worker` process, one endpoint on a local HTTP receiver
that verifies every signature with ``standardwebhooks``. Events are published one transaction
each, at a steady rate, as changes happen in the service; the receiver takes each arrival's
time minus the event's ``timestamp`` (same clock). Prints progress on stderr and one final
JSON line on stdout. Creates and drops its own database on the server of
GPUMETER_DATABASE_URL (default postgresql://postgres@127.0.0.1/postgres).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text
from standardwebhooks import Webhook

from app.core.db import transaction
from app.core.local_service import free_port
from app.core.scratch_db import scratch_database, server_from_environment
from app.events.service import publish
from app.settings import get_settings, sqlalchemy_url
from app.webhooks.schemas import EndpointCreate
from app.webhooks.service import create_endpoint
from app.wiring import install

GPUMETER = Path(sys.executable).parent / "gpumeter"


class Arrivals:
    """What the receiver saw: per event id, the seconds from the event to its arrival."""

    def __init__(self) -> None:
        self.latency_s: dict[str, float] = {}
        self.rejected = 0
        self.lock = threading.Lock()
        self.secret = ""

    def receive(self, body: bytes, headers: dict[str, str]) -> bool:
        arrived = datetime.now(UTC)
        try:
            event = Webhook(self.secret).verify(body, headers)
        except Exception:
            with self.lock:
                self.rejected += 1
            return False
        sent = datetime.fromisoformat(event["timestamp"])
        with self.lock:
            self.latency_s.setdefault(event["id"], (arrived - sent).total_seconds())
        return True


def serve(arrivals: Arrivals, port: int) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            ok = arrivals.receive(body, dict(self.headers.items()))
            self.send_response(204 if ok else 400)
            self.end_headers()

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=300)
    parser.add_argument("--rate", type=float, default=50.0, help="events per second")
    args = parser.parse_args()
    # Endpoint secrets are encrypted at rest with a key derived from the secret key: this
    # process writes the endpoint, the worker reads it, so both need the same one.
    os.environ.setdefault("GPUMETER_SECRET_KEY", secrets.token_urlsafe(32))
    get_settings.cache_clear()  # read at import by the job schedules, before the key was set
    install()
    arrivals, port = Arrivals(), free_port()
    server = serve(arrivals, port)
    with scratch_database(server_from_environment(), "gpumeter_bench_webhooks") as url:
        engine = create_engine(sqlalchemy_url(url))
        with transaction(engine) as session:
            endpoint = EndpointCreate.model_validate({"url": f"http://127.0.0.1:{port}/hooks"})
            # the receiver is on 127.0.0.1
            arrivals.secret = create_endpoint(session, endpoint, allow_private=True).secret
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUMETER_")}
        env |= {
            "GPUMETER_DATABASE_URL": url,
            "GPUMETER_SECRET_KEY": os.environ["GPUMETER_SECRET_KEY"],
            "GPUMETER_WEBHOOK_ALLOW_PRIVATE": "true",
        }
        worker = subprocess.Popen(
            [str(GPUMETER), "worker"], env=env, stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL
        )
        try:
            with engine.connect() as connection:
                while not connection.scalar(text("SELECT count(*) FROM procrastinate_workers")):
                    time.sleep(0.1)
            print(f"worker up; publishing {args.events} events at {args.rate}/s", file=sys.stderr)
            started = time.perf_counter()
            publish_lags = []
            for n in range(args.events):
                due = started + n / args.rate
                time.sleep(max(0.0, due - time.perf_counter()))  # the steady arrival rate
                publish_lags.append(time.perf_counter() - due)
                with transaction(engine) as session:
                    publish(session, "bench.happened", {"n": n}, subject=f"thing/{n % 10}")
            deadline = time.monotonic() + 120
            while len(arrivals.latency_s) < args.events and time.monotonic() < deadline:
                time.sleep(0.05)
            wall_s = time.perf_counter() - started
        finally:
            worker.send_signal(signal.SIGTERM)
            worker.wait(timeout=30)
            engine.dispose()
    server.shutdown()
    latencies = list(arrivals.latency_s.values())
    result = {
        "bench": "webhooks",
        "events": args.events,
        "rate_per_s": args.rate,
        "delivered": len(latencies),
        "rejected": arrivals.rejected,
        "p50_ms": round(percentile(latencies, 0.50) * 1000, 1),
        "p90_ms": round(percentile(latencies, 0.90) * 1000, 1),
        "p99_ms": round(percentile(latencies, 0.99) * 1000, 1),
        "max_ms": round(max(latencies) * 1000, 1),
        "mean_ms": round(statistics.mean(latencies) * 1000, 1),
        "wall_s": round(wall_s, 2),
        # The rate asked is only offered if each event was published when it was due.
        "publish_lag_max_ms": round(max(publish_lags) * 1000, 1),
    }
    # Latencies of delivered events say nothing of the ones that never arrived.
    result["pass"] = len(latencies) == args.events and not arrivals.rejected
    print(json.dumps(result))
    return 0 if result["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
