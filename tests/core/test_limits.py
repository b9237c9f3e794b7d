"""Limits before work: sizes, authentication before the body, database outages, slow clients."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import create_engine
from starlette.types import Message

from app.core.errors import SHUTTING_DOWN
from app.core.limits import MAX_HEADER_BYTES, Limits, RequestLimits
from app.core.local_service import free_port, wait_until_ready
from app.core.processes import stop_child
from app.dashboard import sessions, tokens
from app.main import create_app
from app.settings import get_settings
from tests.harness import bearer

BIN = Path(sys.executable).parent
LIMIT = get_settings().max_body_bytes


def call(app: FastAPI, method: str, path: str, headers: dict[str, str]) -> tuple[int, bool]:
    """Run one request through the ASGI app; the status, and whether the body was read."""
    read = False
    status = 0

    async def receive() -> dict[str, Any]:
        nonlocal read
        read = True
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "scheme": "http",
        "server": ("testserver", 80),
        "client": ("127.0.0.1", 1),
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
    }
    asyncio.run(app(scope, receive, send))
    return status, read


def test_a_body_is_never_read_before_its_key_is_valid(app: FastAPI, admin_key: str) -> None:
    assert call(app, "POST", "/v1/customers", {}) == (401, False)
    assert call(app, "POST", "/v1/ingest", bearer("gm_node_forged")) == (401, False)
    status, read = call(app, "POST", "/v1/customers", bearer(admin_key))
    assert (status, read) == (422, True)  # a valid key: the (empty) body is read and judged


def test_a_declared_body_over_the_limit_is_refused_before_it_is_read(
    app: FastAPI, admin_key: str
) -> None:
    headers = {**bearer(admin_key), "Content-Length": str(LIMIT + 1)}
    assert call(app, "POST", "/v1/customers", headers) == (413, False)
    assert call(app, "POST", "/v1/ingest", headers) == (413, False)  # served ahead of FastAPI


def test_a_streamed_body_is_cut_off_at_the_limit(client: TestClient, admin_key: str) -> None:
    def chunks() -> Iterator[bytes]:
        for _ in range(LIMIT // 2**20 + 2):
            yield b" " * 2**20

    response = client.post("/v1/customers", content=chunks(), headers=bearer(admin_key))
    assert response.status_code == 413
    assert response.json()["detail"][0]["type"] == "payload_too_large"


def test_the_api_answers_503_with_retry_after_when_postgres_is_down() -> None:
    engine = create_engine(f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/x")
    with TestClient(create_app(engine)) as client:
        for response in (
            client.get("/v1/customers", headers=bearer("gm_admin_x")),
            client.post("/v1/customers", json={"name": "x"}, headers=bearer("gm_admin_x")),
        ):
            assert response.status_code == 503, response.text
            assert response.headers["retry-after"] == "1"
            assert response.json()["detail"][0]["type"] == "unavailable"
    engine.dispose()


def rss_mib(pid: int) -> float:
    """Resident memory of a process and its children (the uvicorn workers)."""
    pids = [
        pid,
        *map(
            int,
            subprocess.run(
                ["pgrep", "-P", str(pid)], capture_output=True, text=True
            ).stdout.split(),
        ),
    ]
    total = 0
    for p in pids:
        for line in Path(f"/proc/{p}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1])
    return total / 1024


@pytest.fixture
def served(database_url: str, db: object, tmp_path: Path) -> Iterator[tuple[str, int]]:
    port = free_port()
    env = {**os.environ, "GPUMETER_DATABASE_URL": database_url, "GPUMETER_HEADER_TIMEOUT_S": "2"}
    with (tmp_path / "serve.log").open("wb") as log:
        process = subprocess.Popen(
            [BIN / "gpumeter", "serve", "--port", str(port)], env=env, stderr=log
        )
    try:
        wait_until_ready(f"http://127.0.0.1:{port}", process, timeout_s=60)
        yield f"http://127.0.0.1:{port}", process.pid
    finally:
        stop_child(process, "service")


@pytest.mark.e2e
def test_a_200_mb_anonymous_body_costs_the_server_no_memory(served: tuple[str, int]) -> None:
    base, pid = served
    before = rss_mib(pid)
    chunk = b"x" * 2**20

    def body() -> Iterator[bytes]:
        for _ in range(200):
            yield chunk

    for headers in ({}, bearer("gm_node_forged")):
        try:
            response = httpx.post(f"{base}/v1/ingest", content=body(), headers=headers, timeout=30)
            assert response.status_code == 401
        except httpx.RemoteProtocolError:
            pass  # the server answered 401 and closed while we were still sending
    after = rss_mib(pid)
    assert after - before < 20, (before, after)
    assert httpx.get(f"{base}/healthz").status_code == 200


@pytest.mark.e2e
def test_a_client_too_slow_with_its_headers_is_disconnected(served: tuple[str, int]) -> None:
    host, port = served[0].removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # ... and never the blank line
        started = time.monotonic()
        assert sock.recv(1024) == b""  # closed by the server
    assert 1.5 < time.monotonic() - started < 8


def test_headers_over_the_size_cap_lose_the_connection(served: tuple[str, int]) -> None:
    host, port = served[0].removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        started = time.monotonic()
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: ")
        try:
            for _ in range(MAX_HEADER_BYTES // 4096 + 64):
                sock.sendall(b"a" * 4096)
            closed = sock.recv(1024) == b""  # closed by the server, without an answer
        except ConnectionError:
            closed = True  # closed (reset, broken pipe) while the rest was still arriving
    # The size cap, not the 2-s header deadline (which would close it too, later).
    assert closed and time.monotonic() - started < 1.5


def test_a_dashboard_session_gets_503_too_when_postgres_is_down() -> None:
    engine = create_engine(f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/x")
    claims = {
        "sid": str(uuid.uuid4()),
        "kind": "customer",
        "kid": str(uuid.uuid4()),
        "cid": None,
        "key": True,
        "iat": 0,
    }
    secret = get_settings().secret_key or ""
    cookie = tokens.sign(secret, tokens.Purpose.SESSION, claims, int(time.time()) + 60)
    with TestClient(create_app(engine)) as client:
        response = client.get(
            "/v1/customers", headers={"Cookie": f"{sessions.COOKIE_NAME}={cookie}"}
        )
    engine.dispose()
    assert response.status_code == 503 and response.headers["retry-after"] == "1"


def test_requests_the_server_cancels_are_answered_503_not_500() -> None:
    """uvicorn cancels what still runs when its graceful shutdown times out: a request running
    and one still waiting for an in-flight slot. Each client then gets a deliberate 503 to
    retry, and the cancellation still reaches the server."""
    entered = asyncio.Event()

    async def endless(scope: Any, receive: Any, send: Any) -> None:
        entered.set()
        await asyncio.Event().wait()

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    sent: dict[str, list[Message]] = {"running": [], "queued": []}

    async def scenario() -> None:
        limits = RequestLimits(endless, Limits(1024, 1, 60.0, 1.0, 1024.0, 120.0))
        scope = {"type": "http", "path": "/v1/ingest", "headers": []}

        def request(name: str) -> asyncio.Task[None]:
            async def send(message: Message) -> None:
                sent[name].append(message)

            return asyncio.create_task(limits(scope, receive, send))

        running = request("running")
        await entered.wait()
        queued = request("queued")
        while not limits.slots._waiters:  # the second request queues for the one slot
            await asyncio.sleep(0)
        for task in (queued, running):
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(scenario())
    for start, body in sent.values():
        assert start["status"] == 503 and dict(start["headers"])[b"retry-after"] == b"1"
        assert json.loads(body["body"])["detail"][0]["msg"] == SHUTTING_DOWN
