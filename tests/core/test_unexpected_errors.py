"""An error nothing handles is the API's JSON 500 (``app.core.errors.internal_error``), on
FastAPI's routes and on ingest's, which is served ahead of FastAPI's stack: never Starlette's
or uvicorn's plain-text "Internal Server Error"."""

from __future__ import annotations

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from app.core.errors import INTERNAL_ERROR
from app.metering.endpoints import IngestEndpoint
from tests.harness import Console, bearer

INTERNAL = {"detail": [{"loc": [], "msg": INTERNAL_ERROR, "type": "internal_error"}]}


def test_a_route_that_raises_answers_the_json_500(app: FastAPI, admin_key: str) -> None:
    def broken() -> None:
        raise RuntimeError("a bug")

    app.add_api_route("/v1/broken", broken, methods=["GET", "POST"])
    with TestClient(app, raise_server_exceptions=False) as client:
        for method in ("GET", "POST"):
            response = client.request(method, "/v1/broken", headers=bearer(admin_key), json={})
            assert response.status_code == 500
            assert response.headers["content-type"] == "application/json"
            assert response.json() == INTERNAL
        # The service keeps serving.
        assert client.get("/v1/customers", headers=bearer(admin_key)).status_code == 200


def test_ingest_that_raises_answers_the_json_500(
    app: FastAPI, console: Console, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = console.node("node-7")["token"]["key"]

    async def broken(*_: object) -> None:
        raise RuntimeError("a bug in ingest")

    monkeypatch.setattr(IngestEndpoint, "_ingest", broken)
    with TestClient(app, raise_server_exceptions=False) as client:
        batch = {"batch_id": "b-1", "records": []}
        response = client.post("/v1/ingest", json=batch, headers=bearer(token))
    assert response.status_code == 500
    assert response.json() == INTERNAL
