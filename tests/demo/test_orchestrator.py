"""The demo's orchestrator over real HTTP: it verifies gpumeter's signatures, acts once per
event however often it is delivered, answers each ``failover.requested`` with ``/resumed``
after its delay, and asks for a re-delivery (503) rather than drop a request it cannot queue."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from app.core.console_client import Api
from app.demo.orchestrator import REQUESTED, Orchestrator
from app.webhooks.signing import headers, new_secret
from tests.harness import wait_for


class RecordingApi(Api):
    """The service's side of the resume call, recorded instead of sent."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any] | None]] = []
        self.lock = threading.Lock()

    def post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        with self.lock:
            self.calls.append((path, body))
        return {"state": "resumed"}

    def close(self) -> None:
        pass


@pytest.fixture
def api() -> RecordingApi:
    return RecordingApi()


def started(api: Api, resume_after_s: float, **options: Any) -> Orchestrator:
    orchestrator = Orchestrator(api, resume_after_s, **options)
    orchestrator.secret = new_secret()
    orchestrator.start()
    return orchestrator


@pytest.fixture
def orchestrator(api: RecordingApi) -> Iterator[Orchestrator]:
    running = started(api, 0.2)
    yield running
    running.stop()


def deliver(orchestrator: Orchestrator, event_type: str, data: dict[str, Any], **kw: Any) -> int:
    event_id = kw.get("event_id", str(uuid.uuid4()))
    body = json.dumps({"id": event_id, "type": event_type, "data": data,
                       "timestamp": datetime.now(UTC).isoformat()})  # fmt: skip
    secret = kw.get("secret", orchestrator.secret)
    signed = headers(event_id, datetime.now(UTC), body, [secret])
    return httpx.post(orchestrator.url, content=body, headers=signed, timeout=10).status_code


def test_a_requested_failover_is_resumed_after_the_delay(
    orchestrator: Orchestrator, api: RecordingApi
) -> None:
    failover = str(uuid.uuid4())
    before = int(datetime.now(UTC).timestamp())
    assert deliver(orchestrator, REQUESTED, {"failover_id": failover}) == 204
    wait_for(lambda: failover in orchestrator.resumed(), "the resume call", timeout_s=10)
    resume = orchestrator.resumed()[failover]
    assert resume.resumed_at >= before
    resumed_at = datetime.fromtimestamp(resume.resumed_at, UTC).isoformat()
    assert api.calls == [(f"/v1/failovers/{failover}/resumed", {"resumed_at": resumed_at})]
    assert [a.data for a in orchestrator.events(REQUESTED)] == [{"failover_id": failover}]


def test_a_redelivered_event_is_acted_on_once(
    orchestrator: Orchestrator, api: RecordingApi
) -> None:
    event_id, failover = str(uuid.uuid4()), str(uuid.uuid4())
    for _ in range(3):
        assert deliver(orchestrator, REQUESTED, {"failover_id": failover}, event_id=event_id) == 204
    wait_for(lambda: failover in orchestrator.resumed(), "the resume call", timeout_s=10)
    assert len(api.calls) == 1 and len(orchestrator.events(REQUESTED)) == 1


def test_a_bad_signature_is_refused_and_ignored(
    orchestrator: Orchestrator, api: RecordingApi
) -> None:
    status = deliver(orchestrator, REQUESTED, {"failover_id": "x"}, secret=new_secret())
    assert status == 400
    assert orchestrator.arrivals == [] and api.calls == []
    assert orchestrator.errors and "webhook refused" in orchestrator.errors[0]


def test_other_events_are_kept_but_not_answered(
    orchestrator: Orchestrator, api: RecordingApi
) -> None:
    data = {"gpu_uuid": "GPU-1", "to_state": "failed"}
    assert deliver(orchestrator, "gpu.state_changed", data) == 204
    assert [a.data for a in orchestrator.events("gpu.state_changed")] == [data]
    assert orchestrator.events(REQUESTED) == [] and api.calls == []


def test_a_full_queue_asks_for_a_redelivery(api: RecordingApi) -> None:
    orchestrator = started(api, 30, max_pending=1)  # the first waits its 30 s in hand
    try:
        first, queued, refused = ({"failover_id": str(uuid.uuid4())} for _ in range(3))
        assert deliver(orchestrator, REQUESTED, first) == 204
        wait_for(lambda: orchestrator.pending == 0, "the first taken up")
        assert deliver(orchestrator, REQUESTED, queued) == 204
        assert deliver(orchestrator, REQUESTED, refused) == 503
        assert [a.data for a in orchestrator.events(REQUESTED)] == [first, queued]
    finally:
        orchestrator.stop()
    assert api.calls == []  # stopped before their delay was up: none answered
