"""A body trickled a few bytes at a time, each pause short of the pause bound, no longer holds
a request slot and its connection for ever: real trickling clients over real sockets against
a real ``gpumeter serve`` are answered 408 in the API's error shape and closed within the
body bounds, on ingest and on the API, while a real node's uploads keep being stored."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import urlsplit

import pytest

from app.core.processes import wait_until
from metering_agent.nvml.simulated import sim_uuid
from tests.e2e.conftest import Fleet

pytestmark = pytest.mark.e2e
PAUSE_S = 2.0  # GPUMETER_BODY_READ_TIMEOUT_S: also the grace before the minimum rate counts
MIN_RATE = 1024  # GPUMETER_BODY_MIN_RATE, bytes a second
DEADLINE_S = 5.0  # GPUMETER_BODY_DEADLINE_S
INGEST_SLOTS = 3  # GPUMETER_INGEST_IN_FLIGHT: the tricklers take every one of them
TRICKLE_FOR_S = 30.0  # how long a trickler keeps sending if nobody stops it


@pytest.fixture(autouse=True)
def tight_body_bounds(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Settings of the service the ``fleet`` fixture starts (autouse: set before it)."""
    monkeypatch.setenv("GPUMETER_BODY_READ_TIMEOUT_S", str(PAUSE_S))
    monkeypatch.setenv("GPUMETER_BODY_MIN_RATE", str(MIN_RATE))
    monkeypatch.setenv("GPUMETER_BODY_DEADLINE_S", str(DEADLINE_S))
    monkeypatch.setenv("GPUMETER_INGEST_IN_FLIGHT", str(INGEST_SLOTS))
    yield


@dataclass(frozen=True)
class Answer:
    status: int
    detail: list[dict[str, object]]
    after_s: float  # from the first byte of the request to the end of the answer
    closed: bool  # the server closed the connection after its answer


def trickle(url: str, path: str, token: str, chunk: bytes, every_s: float) -> Answer:
    """POST a 1-MB body ``chunk`` by ``chunk``, one every ``every_s``, until answered."""
    parts = urlsplit(url)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {2**20}\r\n\r\n"
    )
    received = b""
    with socket.create_connection((parts.hostname, parts.port), timeout=every_s) as sock:
        began = time.monotonic()
        sock.sendall(head.encode())
        while time.monotonic() - began < TRICKLE_FOR_S:
            try:
                data = sock.recv(65536)
            except TimeoutError:
                # The server may have closed while we sent: read what it answered.
                with contextlib.suppress(OSError):
                    sock.sendall(chunk)
                continue
            except ConnectionResetError:
                break
            if not data:
                break
            received += data
        after = time.monotonic() - began
        closed = time.monotonic() - began < TRICKLE_FOR_S
    status_line, _, rest = received.partition(b"\r\n")
    body = rest.partition(b"\r\n\r\n")[2]
    status = int(status_line.split()[1]) if status_line else 0
    detail = json.loads(body)["detail"] if body else []
    return Answer(status, detail, after, closed)


def last_stored_second(fleet: Fleet, gpus: list[str], since: int) -> int:
    """The end of the newest second stored for every one of the GPUs (``since`` if none)."""
    if not {g["uuid"] for g in fleet.gpus()} >= set(gpus):
        return since
    now = int(time.time()) + 1
    ends = [
        max((s["end_s"] for s in fleet.timeline(gpu, since, now)["segments"]), default=since)
        for gpu in gpus
    ]
    return min(ends)


def test_tricklers_are_answered_408_and_closed_while_a_node_keeps_uploading(
    fleet: Fleet,
) -> None:
    fleet.agent("node-real", fleet.node("node-real"), "--simulate", "2")
    gpus = [sim_uuid("node-real", i, "node-real") for i in range(2)]
    t0 = int(time.time())
    assert wait_until(lambda: last_stored_second(fleet, gpus, t0) > t0, 60)
    token = fleet.node("node-trickle")
    url = fleet.service.url
    with ThreadPoolExecutor(INGEST_SLOTS + 2) as pool:
        began = time.time()
        # On ingest, one byte every 0.3 s (under the pause bound, far under the minimum rate):
        # every ingest slot of the worker.
        slow = [
            pool.submit(trickle, url, "/v1/ingest", token, b" ", 0.3) for _ in range(INGEST_SLOTS)
        ]
        # On the API, 4 KB a second (over the minimum rate) of a 1-MB body: only the
        # deadline ends it.
        steady = [
            pool.submit(trickle, url, "/v1/customers", fleet.admin, b" " * 2048, 0.5)
            for _ in range(2)
        ]
        answers = [future.result() for future in slow], [future.result() for future in steady]
    for answer in answers[0]:
        assert (answer.status, answer.closed) == (408, True), answer
        [error] = answer.detail
        assert error == {
            "loc": [],
            "msg": f"the request body arrived slower than {MIN_RATE} bytes a second",
            "type": "timeout",
        }
        assert PAUSE_S <= answer.after_s < PAUSE_S + 2, answer
    for answer in answers[1]:
        assert (answer.status, answer.closed) == (408, True), answer
        [error] = answer.detail
        assert error["msg"] == f"the request body did not arrive within {DEADLINE_S:g} s"
        assert DEADLINE_S <= answer.after_s < DEADLINE_S + 2, answer
    # The node's uploads were served meanwhile: its GPUs are stored up to the last seconds.
    answered = int(time.time())
    assert wait_until(lambda: last_stored_second(fleet, gpus, t0) >= answered - 1, 15), (
        last_stored_second(fleet, gpus, t0),
        answered,
        began,
    )
    assert not list((fleet.tmp / "spool-node-real" / "dead-letter").iterdir())
