"""Limits before work: every request's size, wait and body-read time are bounded.

``RequestLimits`` is pure ASGI (it never buffers a body):
- a declared ``Content-Length`` over the limit is refused with 413 before a byte is read, and a
  chunked body is counted as it streams and cut off at the limit;
- a body is answered 408 (and its connection closed) when it stops arriving for
  ``body_read_timeout_s``, when it arrives slower than ``body_min_rate`` bytes a second on
  average once its first ``body_read_timeout_s`` have passed, or when it is not complete
  ``body_deadline_s`` after its request got its slot: a body trickled a few bytes at a time,
  each pause short of the first bound, no longer keeps a slot and a connection for ever;
- at most ``max_in_flight`` requests per worker run at once, sized to the database pool, so
  every running request can get a connection and a thread: threads can no longer all wait on
  the pool while the pool's connections wait for threads. A request that finds no slot within
  ``queue_wait_s`` is shed with 503 and ``Retry-After``.

``BoundedHttpToolsProtocol`` adds what uvicorn lacks: a deadline for a request's headers, so a
client that sends them a byte at a time (or never) loses its connection, and a cap on their size
(httptools, unlike h11, has none). httptools, not h11: its C parser costs a fraction of h11's
pure-Python one per request.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from app.core.errors import SHUTTING_DOWN, ApiError, Loc, ServiceUnavailable, error_headers
from app.settings import Settings, get_settings

# Liveness must answer while the worker sheds load: it touches no database.
UNLIMITED_PATHS = frozenset({"/healthz"})
MAX_HEADER_BYTES = 64 * 1024


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int
    max_in_flight: int
    queue_wait_s: float
    body_read_timeout_s: float
    body_min_rate: float
    body_deadline_s: float

    @classmethod
    def of(cls, settings: Settings) -> Limits:
        return cls(
            max_body_bytes=settings.max_body_bytes,
            max_in_flight=settings.requests_in_flight,
            queue_wait_s=settings.queue_wait_s,
            body_read_timeout_s=settings.body_read_timeout_s,
            body_min_rate=settings.body_min_rate,
            body_deadline_s=settings.body_deadline_s,
        )

    def body_wait(self, elapsed: float, received: int) -> tuple[float, str]:
        """How long the next piece of a body may take, ``elapsed`` seconds after its request
        got its slot with ``received`` bytes read, and what to say if it takes longer."""
        pause = self.body_read_timeout_s
        by_rate = pause + received / self.body_min_rate - elapsed
        by_deadline = self.body_deadline_s - elapsed
        if pause <= by_rate and pause <= by_deadline:
            return pause, f"the request body stopped arriving for {pause:g} s"
        if by_rate <= by_deadline:
            return by_rate, (
                f"the request body arrived slower than {self.body_min_rate:g} bytes a second"
            )
        return by_deadline, f"the request body did not arrive within {self.body_deadline_s:g} s"


async def send_error(
    send: Send,
    status: int,
    msg: str,
    kind: str,
    loc: Loc = (),
    headers: dict[str, str] | None = None,
    *,
    close: bool = True,
) -> None:
    """An error in the API's one shape, sent straight from ASGI, closing the connection
    unless ``close`` is false (the body, if any, is left unread: a body within the limit
    may be, as the server discards what the app did not read)."""
    items = [{"loc": list(loc), "msg": msg, "type": kind}]
    await _send_items(send, status, items, headers or {}, close=close)


async def send_api_error(send: Send, error: ApiError, *, close: bool = True) -> None:
    """``send_error`` for a raised ``ApiError``: its status, items and headers."""
    await _send_items(send, error.status_code, error.items, error_headers(error), close=close)


async def _send_items(
    send: Send, status: int, items: list[dict[str, Any]], headers: dict[str, str], *, close: bool
) -> None:
    body = json.dumps({"detail": items}).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(name.lower().encode(), value.encode()) for name, value in headers.items()]
    if close:
        raw.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


async def send_unavailable(send: Send, msg: str, *, close: bool = True) -> None:
    await send_api_error(send, ServiceUnavailable(msg), close=close)


class RequestLimits:
    def __init__(self, app: ASGIApp, limits: Limits | None = None) -> None:
        self.app = app
        self.limits = limits or Limits.of(get_settings())
        self.slots = asyncio.Semaphore(self.limits.max_in_flight)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in UNLIMITED_PATHS:
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.limits.max_body_bytes:
            await send_error(send, 413, self._too_large(), "payload_too_large")
            return
        try:
            # asyncio.timeout, not wait_for: no task of its own per request (nor per receive).
            async with asyncio.timeout(self.limits.queue_wait_s):
                await self.slots.acquire()
        except TimeoutError:
            # The connection stays: under overload an agent's retry should not cost a new one.
            await send_unavailable(send, "the service is overloaded; retry later", close=False)
            return
        except asyncio.CancelledError:  # shutdown cancelled it while it queued (see below)
            await send_unavailable(send, SHUTTING_DOWN)
            raise
        try:
            await self._call_bounded(scope, receive, send)
        finally:
            self.slots.release()

    async def _call_bounded(self, scope: Scope, receive: Receive, send: Send) -> None:
        received = 0
        started = refused = False
        began = time.monotonic()

        async def refuse(status: int, msg: str, kind: str) -> Message:
            # Answer now; the app sees the client gone and whatever it answers is dropped.
            nonlocal refused
            if not started:
                await send_error(send, status, msg, kind)
            refused = True
            return {"type": "http.disconnect"}

        async def bounded_receive() -> Message:
            nonlocal received
            wait, why = self.limits.body_wait(time.monotonic() - began, received)
            try:
                async with asyncio.timeout(max(0.0, wait)):
                    message = await receive()
            except TimeoutError:
                return await refuse(408, why, "timeout")
            received += len(message.get("body", b""))
            if received > self.limits.max_body_bytes:
                return await refuse(413, self._too_large(), "payload_too_large")
            return message

        async def tracked_send(message: Message) -> None:
            nonlocal started
            if refused:
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, bounded_receive, tracked_send)
        except asyncio.CancelledError:
            # The server stopped waiting for this request (its graceful shutdown timed out):
            # a deliberate 503 the client retries elsewhere, not the 500 it would send.
            if not started and not refused:
                await send_unavailable(send, SHUTTING_DOWN)
            raise

    def _too_large(self) -> str:
        return f"the request body is larger than {self.limits.max_body_bytes} bytes"


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, closing a connection whose request headers are not complete
    within ``header_timeout_s`` of its start (or of the previous response), or within
    ``MAX_HEADER_BYTES``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_deadline: asyncio.TimerHandle | None = None
        self._waiting_after: object = None  # the cycle that was current when the wait began
        self._header_bytes = 0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._await_headers()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._header_deadline is None:
            return
        if self.cycle is not self._waiting_after:
            self._header_deadline.cancel()  # a new request's headers are complete
            self._header_deadline = None
            return
        self._header_bytes += len(data)
        if self._header_bytes > MAX_HEADER_BYTES and not self.transport.is_closing():
            self.transport.close()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._await_headers()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
        super().connection_lost(exc)

    def _await_headers(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None
        if self.cycle is not None and not self.cycle.response_complete:
            return  # a pipelined request is already running
        self._waiting_after = self.cycle
        self._header_bytes = 0
        timeout = get_settings().header_timeout_s
        self._header_deadline = self.loop.call_later(timeout, self._headers_too_slow)

    def _headers_too_slow(self) -> None:
        self._header_deadline = None
        if self.cycle is self._waiting_after and not self.transport.is_closing():
            self.transport.close()
