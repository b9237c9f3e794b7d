"""A provider's orchestrator, as small as one can be: it receives gpumeter's signed webhooks on
127.0.0.1 and answers each ``failover.requested`` after a fixed delay (the job restarting on
the spare) with ``POST /v1/failovers/{id}/resumed``.

Signatures are checked with ``standardwebhooks``, the library ``app.webhooks`` signs with, as
a provider's receiver would. Deliveries are at least once, so an event id seen before is
acknowledged and not acted on again. The webhook is answered at once (204) and the resume is
queued; a full queue answers 503, so gpumeter retries the delivery later instead of it being
dropped. The demo, the failover benchmark and the end-to-end failover test use it.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
from standardwebhooks import Webhook

from app.core.console_client import Api, ApiError
from app.core.epoch import from_epoch

log = logging.getLogger(__name__)

REQUESTED = "failover.requested"
NO_SPARE = "failover.no_spare"
EVENT_TYPES = [REQUESTED, NO_SPARE, "failover.resumed", "gpu.state_changed"]
MAX_PENDING = 1000  # failovers waiting for their resume call
RESUME_ATTEMPTS = 3  # a 503 (shed) or a transport error is retried this often, 1 s apart
STOP_TIMEOUT_S = 10.0
POLL_S = 0.5  # how often the idle answering thread looks for a stop


@dataclass(frozen=True)
class Arrival:
    """One verified webhook: its event (the body) and the wall-clock second it arrived."""

    event: dict[str, Any]
    arrived_at: float

    @property
    def type(self) -> str:
        return str(self.event["type"])

    @property
    def data(self) -> dict[str, Any]:
        return dict(self.event["data"])


@dataclass(frozen=True)
class Resume:
    """What the orchestrator told the service: the job runs on the spare since ``resumed_at``."""

    failover_id: str
    resumed_at: int  # epoch second
    answer: dict[str, Any]  # the service's failover after the call


class Orchestrator:
    def __init__(self, api: Api, resume_after_s: float, *, max_pending: int = MAX_PENDING) -> None:
        self.api = api
        self.resume_after_s = resume_after_s
        self.secret = ""  # the endpoint's signing secret, known once registered
        self.arrivals: list[Arrival] = []
        self.resumes: dict[str, Resume] = {}
        self.errors: list[str] = []  # resume calls the service refused, rejected signatures
        self._seen: set[str] = set()
        self._lock = threading.Lock()
        self._pending: queue.Queue[tuple[float, dict[str, Any]]] = queue.Queue(max_pending)
        self._stopping = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._threads = [
            threading.Thread(target=self._server.serve_forever, name="webhooks", daemon=True),
            threading.Thread(target=self._answer_loop, name="resumes", daemon=True),
        ]

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/gpumeter-webhooks"

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def register(self) -> str:
        """Subscribe this receiver to the failover events; the endpoint's id."""
        body = {"url": self.url, "event_types": EVENT_TYPES, "description": "orchestrator"}
        endpoint = self.api.post("/v1/webhooks/endpoints", body)
        self.secret = endpoint["secret"]
        return str(endpoint["id"])

    def stop(self) -> None:
        """Stop receiving and answering; failovers still waiting for their delay stay
        unanswered (their reservations expire in the service), and the log says how many."""
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()
        for thread in self._threads:
            thread.join(STOP_TIMEOUT_S)
        if unanswered := self._pending.qsize():
            log.warning("orchestrator stopped", extra={"unanswered_failovers": unanswered})

    @property
    def pending(self) -> int:
        """Requested failovers queued for their resume, not yet taken up."""
        return self._pending.qsize()

    # --- what it saw ------------------------------------------------------------------------

    def events(self, event_type: str) -> list[Arrival]:
        with self._lock:
            return [a for a in self.arrivals if a.type == event_type]

    def resumed(self) -> dict[str, Resume]:
        with self._lock:
            return dict(self.resumes)

    # --- receiving ----------------------------------------------------------------------------

    def receive(self, body: bytes, headers: dict[str, str]) -> int:
        """The HTTP status to answer a delivery with."""
        arrived = time.time()
        try:
            event = Webhook(self.secret).verify(body, headers)
        except Exception as refused:  # the library raises its own error for a bad signature
            with self._lock:
                self.errors.append(f"webhook refused: {refused}")
            return 400
        with self._lock:
            if event["id"] in self._seen:
                return 204  # a re-delivery: acknowledged, not acted on twice
        if event["type"] == REQUESTED:
            try:
                self._pending.put_nowait((arrived + self.resume_after_s, event["data"]))
            except queue.Full:
                return 503  # gpumeter retries the delivery later
        with self._lock:
            self._seen.add(event["id"])
            self.arrivals.append(Arrival(event, arrived))
        return 204

    # --- answering ----------------------------------------------------------------------------

    def _answer_loop(self) -> None:
        """Resume each failover when its delay is up; the delay is fixed, so the queue's order
        is the order they fall due."""
        while not self._stopping.is_set():
            try:
                due, requested = self._pending.get(timeout=POLL_S)
            except queue.Empty:
                continue
            if self._stopping.wait(max(0.0, due - time.time())):
                return
            self._resume(requested)

    def _resume(self, requested: dict[str, Any]) -> None:
        failover_id = str(requested["failover_id"])
        resumed_at = int(time.time())
        path = f"/v1/failovers/{failover_id}/resumed"
        for attempt in range(1, RESUME_ATTEMPTS + 1):
            try:
                answer = self.api.post(path, {"resumed_at": from_epoch(resumed_at).isoformat()})
            except ApiError as refused:
                if " 503 " not in str(refused) or attempt == RESUME_ATTEMPTS:
                    with self._lock:
                        self.errors.append(str(refused))
                    return
            except httpx.TransportError as failure:
                if attempt == RESUME_ATTEMPTS:
                    with self._lock:
                        self.errors.append(f"{path}: {failure!r}")
                    return
            else:
                with self._lock:
                    self.resumes[failover_id] = Resume(failover_id, resumed_at, answer)
                return
            if self._stopping.wait(1):
                return


def _handler(orchestrator: Orchestrator) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            status = orchestrator.receive(body, dict(self.headers.items()))
            self.send_response(status)
            self.end_headers()

        def log_message(self, *_: Any) -> None:
            pass  # the orchestrator keeps what matters; no access log on stderr

    return Handler
