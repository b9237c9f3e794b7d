"""A real HTTP receiver of webhooks that verifies every signature with ``standardwebhooks``.

It can be down (its port closed), answer 5xx, or hold requests (to kill a worker mid-delivery);
it records each verified delivery and notices two deliveries of one message at once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from standardwebhooks import Webhook, WebhookVerificationError

from app.core.local_service import free_port


@dataclass
class Delivery:
    path: str
    message_id: str
    body: dict[str, Any]
    host: str  # the Host header it came with


@dataclass
class Receiver:
    secrets: dict[str, str] = field(default_factory=dict)  # path -> the endpoint's secret
    port: int = field(default_factory=free_port)
    status: int = 204
    hold: threading.Event | None = None  # requests wait for it, then go unanswered
    received: list[Delivery] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)
    overlaps: list[tuple[str, str]] = field(default_factory=list)
    held_requests: int = 0
    delay_s: float = 0.0  # a slow endpoint: each answer takes this long
    _in_flight: set[tuple[str, str]] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def start(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                receiver.handle(self)

            def log_message(self, *_: Any) -> None:
                pass

        ThreadingHTTPServer.allow_reuse_address = True
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def handle(self, request: BaseHTTPRequestHandler) -> None:
        body = request.rfile.read(int(request.headers.get("content-length", 0)))
        headers = {k: v for k, v in request.headers.items()}
        key = (request.path, headers.get("webhook-id", ""))
        with self._lock:
            if key in self._in_flight:
                self.overlaps.append(key)
            self._in_flight.add(key)
        try:
            if self.hold is not None:
                with self._lock:
                    self.held_requests += 1
                self.hold.wait(timeout=60)
                return  # the worker was killed meanwhile: nobody reads an answer
            try:
                payload = Webhook(self.secrets[request.path]).verify(body, headers)
            except (WebhookVerificationError, KeyError) as error:
                self.rejected.append(f"{request.path}: {error}")
                request.send_response(400)
                request.end_headers()
                return
            if self.delay_s:
                time.sleep(self.delay_s)
            if 200 <= self.status < 300:
                with self._lock:
                    self.received.append(
                        Delivery(request.path, key[1], payload, headers.get("Host", ""))
                    )
            request.send_response(self.status)
            request.end_headers()
        finally:
            with self._lock:
                self._in_flight.discard(key)

    def ids(self, path: str) -> list[str]:
        with self._lock:
            return [d.message_id for d in self.received if d.path == path]

    def bodies(self, path: str) -> list[dict[str, Any]]:
        with self._lock:
            return [d.body for d in self.received if d.path == path]


@contextmanager
def running(receiver: Receiver) -> Iterator[Receiver]:
    receiver.start()
    try:
        yield receiver
    finally:
        if receiver.hold is not None:
            receiver.hold.set()
        receiver.stop()
