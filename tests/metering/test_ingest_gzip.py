"""POST /v1/ingest with ``Content-Encoding: gzip``: inflated within the body limit, or refused
saying why (#17)."""

from __future__ import annotations

import gzip
import json
from typing import Any

from fastapi.testclient import TestClient

from app.settings import get_settings
from tests.harness import bearer
from tests.metering.conftest import Agent, minute_ago, rec


def post(agent: Agent, body: bytes, encoding: str = "gzip") -> Any:
    headers = {**bearer(agent.token), "Content-Type": "application/json"}
    return agent.client.post(
        "/v1/ingest", content=body, headers={**headers, "Content-Encoding": encoding}
    )


def batch(t: int) -> bytes:
    return json.dumps({"batch_id": "gz-1", "records": [rec("GPU-1", t, t + 60)]}).encode()


def test_a_gzip_body_is_inflated_and_stored(agent: Agent, client: TestClient) -> None:
    t = minute_ago(3)
    response = post(agent, gzip.compress(batch(t)))
    assert response.status_code == 200, response.text
    assert response.json()["accepted"] == 1
    again = post(agent, batch(t), encoding="identity")  # old agents: plain JSON, unchanged
    assert (again.status_code, again.json()["duplicates"]) == (200, 1)


def test_a_gzip_bomb_is_refused_with_the_limit_before_it_inflates(agent: Agent) -> None:
    limit = get_settings().max_body_bytes
    bomb = gzip.compress(b" " * (limit + 1))  # valid JSON whitespace, one byte too many
    assert len(bomb) < limit // 100
    response = post(agent, bomb)
    assert response.status_code == 413
    [item] = response.json()["detail"]
    assert item["msg"] == f"the gzip body inflates to more than the limit of {limit} bytes"
    assert item["loc"] == ["body"]


def test_bad_or_truncated_gzip_is_a_400_saying_so(agent: Agent) -> None:
    packed = gzip.compress(batch(minute_ago(3)))
    cases = {
        b"not gzip at all": "the body is not valid gzip",
        packed[: len(packed) // 2]: "the gzip body is truncated",
        packed + b"trailing": "the gzip body has data after its end",
    }
    for body, message in cases.items():
        response = post(agent, body)
        assert response.status_code == 400, response.text
        assert response.json()["detail"][0]["msg"].startswith(message)


def test_an_unknown_encoding_is_a_415(agent: Agent) -> None:
    response = post(agent, b"...", encoding="br")
    assert response.status_code == 415
    assert response.json()["detail"][0]["loc"] == ["header", "content-encoding"]
