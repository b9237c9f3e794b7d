"""API keys verified once, then served from memory, with revocation bounded in time.

Every request with a key used to cost a transaction of its own (three round trips) before
the request's real work. Keys are looked up by their digest; once found active, the key's
principal is kept in this process. Every ``auth_revocation_check_s`` seconds (5 by default)
one query re-verifies all the keys a process holds (still present, not revoked) and drops the
others, so a key revoked anywhere (another service process, the CLI, SQL) stops working on
every process within that bound; revoked through this process's service, at once.

The check runs in the request that finds it due, before that request is authenticated, and
requests arriving meanwhile wait for it: no key is served from memory past the bound.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Iterable

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from app.auth import repository
from app.auth.principal import Principal
from app.settings import get_settings

# Memory bound: a fleet of 100k GPUs has ~12,500 node tokens; beyond this the cache forgets
# everything at the next check rather than grow (a forgotten key is simply looked up again).
MAX_KEYS = 50_000


class KeyCache:
    def __init__(self, check_every_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.check_every_s = check_every_s
        self._clock = clock
        self._keys: dict[str, Principal] = {}
        self._checked_at = clock()
        self._lock = threading.Lock()

    def lookup(self, digest: str) -> Principal | None:
        """The key's principal if held and the revocation check is not due; else None."""
        if self._due():
            return None
        return self._keys.get(digest)

    def get(self, session: Session, digest: str) -> Principal | None:
        """The key's principal: from memory, or from the database (then remembered)."""
        if self._due():
            with self._lock:
                if self._due():
                    self._recheck(session)
        principal = self._keys.get(digest)
        if principal is None:
            principal = _load(session, digest)
            if principal is not None:
                self._keys[digest] = principal
        return principal

    def forget(self, digests: Iterable[str]) -> None:
        for digest in digests:
            self._keys.pop(digest, None)

    def _due(self) -> bool:
        return self._clock() - self._checked_at >= self.check_every_s

    def _recheck(self, session: Session) -> None:
        began = self._clock()
        held = list(self._keys)
        if len(held) > MAX_KEYS:
            self._keys.clear()
        elif held:
            active = repository.active_digests(session, held)
            self.forget(d for d in held if d not in active)
        self._checked_at = began  # the bound counts from when the check read the keys


def _load(session: Session, digest: str) -> Principal | None:
    key = repository.active_key_by_hash(session, digest)
    if key is None:
        return None
    return Principal(key.id, key.kind, key.customer_id, key.node_id)


_CACHES: weakref.WeakKeyDictionary[Engine, KeyCache] = weakref.WeakKeyDictionary()
_CACHES_LOCK = threading.Lock()


def for_engine(engine: Engine) -> KeyCache:
    """The cache of keys of this engine's database (one per database a process talks to)."""
    with _CACHES_LOCK:
        cache = _CACHES.get(engine)
        if cache is None:
            cache = _CACHES[engine] = KeyCache(get_settings().auth_revocation_check_s)
        return cache


def for_session(session: Session) -> KeyCache:
    bind = session.get_bind()
    return for_engine(bind if isinstance(bind, Engine) else bind.engine)
