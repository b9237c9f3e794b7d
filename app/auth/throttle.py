"""Failed authentication, throttled per client address and per key prefix.

Every request that presents a key and is answered 401 counts one failure for its client
address and for the key's prefix (its first ``PREFIX_LENGTH`` characters, the part a guesser
holds fixed to aim at one key); the dashboard's sign-in form counts its failures too. Past
``auth_failures_per_window`` failures in a window of ``auth_failure_window_s`` seconds, every
request from that address or with that prefix that presents a key is answered 429 with
``Retry-After`` (the rest of the window) before any key is looked up, valid keys included: a
guesser learns nothing more, and the lookups stop.

Memory is bounded: each of the two tables keeps at most ``auth_throttle_tracked`` entries
(``cachetools.TTLCache``: an entry expires with its window, the least recently used goes
first when it is full), so a flood of random addresses or prefixes evicts old entries rather
than growing without end. Per process: with several workers a guesser gets at most workers x
the limit. Behind a proxy the client address is the proxy's unless uvicorn is told to trust its
forwarded headers (``--forwarded-allow-ips``).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from cachetools import TTLCache
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.auth.service import PREFIX_LENGTH
from app.core.errors import TooManyRequests
from app.core.limits import send_api_error
from app.settings import Settings


@dataclass
class _Window:
    ends_at: float
    failures: int = 0


@dataclass
class FailedAuthThrottle:
    limit: int
    window_s: float
    tracked: int
    clock: Callable[[], float] = time.monotonic
    _windows: dict[str, TTLCache[str, _Window]] = field(init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    def __post_init__(self) -> None:
        self._windows = {
            kind: TTLCache(self.tracked, self.window_s, timer=self.clock)
            for kind in ("address", "prefix")
        }

    @classmethod
    def of(cls, settings: Settings) -> FailedAuthThrottle:
        return cls(
            settings.auth_failures_per_window,
            settings.auth_failure_window_s,
            settings.auth_throttle_tracked,
        )

    def retry_after(self, address: str, key: str) -> int | None:
        """Seconds until an attempt from ``address`` with ``key`` may be made; None: now."""
        now = self.clock()
        with self._lock:
            waits = [
                window.ends_at - now
                for kind, value in self._keys(address, key)
                if (window := self._windows[kind].get(value)) is not None
                and window.failures >= self.limit
                and window.ends_at > now
            ]
        return math.ceil(max(waits)) if waits else None

    def failed(self, address: str, key: str) -> None:
        now = self.clock()
        with self._lock:
            for kind, value in self._keys(address, key):
                table = self._windows[kind]
                window = table.get(value)
                if window is None or window.ends_at <= now:
                    window = _Window(now + self.window_s)
                window.failures += 1
                table[value] = window

    @staticmethod
    def _keys(address: str, key: str) -> list[tuple[str, str]]:
        return [("address", address), ("prefix", key[:PREFIX_LENGTH])]


def client_address(scope: Scope) -> str:
    client = scope.get("client")
    return client[0] if client else ""


class ThrottleFailedAuth:
    """The throttle around the whole service (ingest's node tokens included): a request that
    presents a bearer key from a throttled address or prefix gets 429; a 401 counts."""

    def __init__(self, app: ASGIApp, throttle: FailedAuthThrottle) -> None:
        self.app = app
        self.throttle = throttle

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        scheme, _, key = Headers(scope=scope).get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not key:
            await self.app(scope, receive, send)
            return
        address = client_address(scope)
        wait = self.throttle.retry_after(address, key)
        if wait is not None:
            await send_api_error(send, TooManyRequests.after(wait), close=False)
            return

        async def counting(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] == 401:
                self.throttle.failed(address, key)
            await send(message)

        await self.app(scope, receive, counting)
