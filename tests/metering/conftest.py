"""Ingest test helpers: a registered node with its agent token, and record/event builders."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import pytest
from fastapi.testclient import TestClient

from metering_agent.protocol import MINUTE, minute_start
from tests.harness import Console, bearer


def minute_ago(n: int) -> int:
    """The start of the UTC minute ``n`` minutes before the current one."""
    return minute_start(int(time.time())) - n * MINUTE


def rec(gpu: str, start: int, end: int, state: str = "healthy", **fields: Any) -> dict[str, Any]:
    return {
        "gpu_uuid": gpu,
        "model": "H100",
        "start": start,
        "end": end,
        "state": state,
        "sample_count": end - start,
        "gpu_util_mean": 50.0,
        "gpu_util_max": 90,
        **fields,
    }


def event(gpu: str, at: int, kind: str = "xid", **fields: Any) -> dict[str, Any]:
    return {
        "event_id": f"{gpu}-{at}-{kind}-{fields.get('code')}",
        "gpu_uuid": gpu,
        "at": at,
        "kind": kind,
        **fields,
    }


@dataclass
class Agent:
    """A node's agent, posting batches with its token."""

    client: TestClient
    node_id: str
    token: str
    sent: int = 0

    def post(
        self,
        records: list[dict[str, Any]],
        events: list[dict[str, Any]] | None = None,
        status: int = 200,
    ) -> dict[str, Any]:
        self.sent += 1
        body = {"batch_id": f"b-{self.sent}", "records": records, "events": events or []}
        response = self.client.post("/v1/ingest", json=body, headers=bearer(self.token))
        assert response.status_code == status, response.text
        return response.json()


@pytest.fixture
def agent(client: TestClient, console: Console) -> Agent:
    registered = console.node("node-1")
    return Agent(client, registered["node"]["id"], registered["token"]["key"])


@pytest.fixture
def other_agent(client: TestClient, console: Console) -> Agent:
    registered = console.node("node-2")
    return Agent(client, registered["node"]["id"], registered["token"]["key"])
