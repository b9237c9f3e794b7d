"""Failed authentication, throttled per client address and per key; a valid key is never refused.

Every request that presents a key and is answered 401 counts one failure for its client
address and for that exact key (by its digest); the dashboard's sign-in form counts its
failures too. Past ``auth_failures_per_window`` failures in a window of
``auth_failure_window_s`` seconds:

- that exact key is answered 429 with ``Retry-After`` (the rest of the window) before any
  lookup, from any address: a script retrying a revoked key costs no query;
- any other key from that address is looked up (in memory, else one indexed query) and served
  if it is valid, answered 429 if not.

So no tenant's valid key is refused because of other keys' failures, not even from an address
many clients share. Keys are 256-bit random: no rate makes guessing one feasible, so the
throttle guards the service's load and tells a misbehaving client to back off; it does not
protect the keys' secrecy. (It once also counted failures per key *prefix*, the first 12
characters, which every customer key shares: twenty bad keys a minute from anywhere refused
every tenant.)

Memory is bounded: each of the two tables keeps at most ``auth_throttle_tracked`` entries
(``cachetools.TTLCache``: an entry expires with its window, the least recently used goes
first when it is full), so a flood of random addresses or keys evicts old entries rather
than growing without end. Per process: with several workers a client gets at most workers x
the limit. Behind a proxy the client address is the proxy's unless uvicorn trusts its
forwarded headers: ``GPUMETER_FORWARDED_ALLOW_IPS`` names the proxies (``gpumeter serve``
passes it to uvicorn's ``forwarded_allow_ips``), and their ``X-Forwarded-For`` is the address.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from cachetools import TTLCache
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.auth.service import hash_secret
from app.core.errors import TooManyRequests, database_unavailable
from app.core.limits import send_api_error
from app.settings import Settings

# Whether a key is a valid one (any kind): how the throttle lets valid keys through.
KeyCheck = Callable[[str], Awaitable[bool]]


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
            for kind in ("address", "key")
        }

    @classmethod
    def of(cls, settings: Settings) -> FailedAuthThrottle:
        return cls(
            settings.auth_failures_per_window,
            settings.auth_failure_window_s,
            settings.auth_throttle_tracked,
        )

    def key_refused(self, key: str) -> int | None:
        """Seconds this exact key stays refused, having failed too often; None: not refused."""
        return self._wait("key", hash_secret(key))

    def address_throttled(self, address: str) -> int | None:
        """Seconds until a failure from ``address`` is answered 401 again; None: now."""
        return self._wait("address", address)

    def failed(self, address: str, key: str) -> None:
        now = self.clock()
        with self._lock:
            for kind, value in (("address", address), ("key", hash_secret(key))):
                table = self._windows[kind]
                window = table.get(value)
                if window is None or window.ends_at <= now:
                    window = _Window(now + self.window_s)
                window.failures += 1
                table[value] = window

    def _wait(self, kind: str, value: str) -> int | None:
        now = self.clock()
        with self._lock:
            window = self._windows[kind].get(value)
            if window is None or window.failures < self.limit or window.ends_at <= now:
                return None
            return math.ceil(window.ends_at - now)


def client_address(scope: Scope) -> str:
    client = scope.get("client")
    return client[0] if client else ""


class ThrottleFailedAuth:
    """The throttle around the whole service (ingest's node tokens included): a key that failed
    too often, or an invalid key from an address that did, gets 429; a 401 counts."""

    def __init__(self, app: ASGIApp, throttle: FailedAuthThrottle, valid: KeyCheck) -> None:
        self.app = app
        self.throttle = throttle
        self.valid = valid

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        scheme, _, key = Headers(scope=scope).get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not key:
            await self.app(scope, receive, send)
            return
        address = client_address(scope)
        wait = self.throttle.key_refused(key)
        if wait is None and (wait := self.throttle.address_throttled(address)) is not None:
            try:
                valid = await self.valid(key)
            except Exception as exc:
                if (unavailable := database_unavailable(exc, scope["path"])) is None:
                    raise
                await send_api_error(send, unavailable)
                return
            if valid:
                wait = None
            else:
                self.throttle.failed(address, key)
        if wait is not None:
            await send_api_error(send, TooManyRequests.after(wait), close=False)
            return

        async def counting(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] == 401:
                self.throttle.failed(address, key)
            await send(message)

        await self.app(scope, receive, counting)
