"""Uploader: sends sealed spool batches to ``POST {server}/v1/ingest``, oldest first.

- 2xx: stored (duplicates included); the batch file is removed. Items the answer lists as not
  stored (``not_stored``: a GPU whose UUID another node claims too) are not re-sent: ``held``
  ones the service keeps until an operator settles the clash (logged, counted); ``refused``
  ones are kept in the dead-letter folder with the service's reason (logged as an error,
  counted), never dropped unseen.
- 4xx (except 408 and 429, which are "try later"): rejected; the batch moves to the spool's
  dead-letter folder, logged as an error, and the uploader carries on with the next one.
- 5xx, 408, 429, network errors and timeouts: the same batch is retried with exponential backoff
  and jitter, so the order of batches is kept and nothing is skipped.
- ``Retry-After`` (delta-seconds or an HTTP-date, on a 503 or 429 from a service shedding load)
  sets the least wait, capped at ``retry_after_max_s``, plus up to half as much again at random:
  a fleet told to come back in 10 s comes back over 10-15 s, not all in the same second.

When: the sampling loop cuts and seals a batch at every upload round and tells the uploader the
round's time (``send_at``, jittered per agent: ``schedule.py``), or "now" after a health event.
Without such a request the spool is looked at every ``interval_s`` (leftovers, retries).
Transport: one kept-alive connection, gzip bodies (``transport.py``).
"""

from __future__ import annotations

import email.utils
import enum
import http.client
import json
import math
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC
from pathlib import Path
from typing import Any

from metering_agent.logs import Log
from metering_agent.metrics import Metrics
from metering_agent.protocol import INGEST_PATH, Withheld
from metering_agent.spool import Spool, coalesce, read_batch
from metering_agent.transport import Transport

log = Log("metering_agent.uploader")
RETRYABLE_4XX = {408, 429}
THROTTLED = {429, 503}  # the service sheds load; it may say when to come back
RETRY_AFTER_JITTER = 0.5  # a Retry-After wait is stretched by up to this share, at random


class Outcome(enum.Enum):
    STORED = "stored"
    REJECTED = "rejected"
    RETRY = "retry"


@dataclass(frozen=True, slots=True)
class Reply:
    outcome: Outcome
    retry_after_s: float | None = None  # what the service asked for (Retry-After)


def retry_after_seconds(value: str | None, now: float) -> float | None:
    """A ``Retry-After`` header as seconds from ``now``: delta-seconds or an HTTP-date."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:  # "-0000": UTC, origin unknown
            when = when.replace(tzinfo=UTC)
        seconds = when.timestamp() - now
    return max(0.0, seconds) if math.isfinite(seconds) else None


@dataclass(slots=True)
class Backoff:
    """Exponential backoff with "equal jitter" (half the delay fixed, half random), and never
    less than what the service asked for with ``Retry-After``, itself jittered."""

    base_s: float = 1.0
    cap_s: float = 60.0
    retry_after_max_s: float = 600.0
    attempts: int = 0
    rng: random.Random = field(default_factory=random.Random)

    def next_delay(self, retry_after_s: float | None = None) -> float:
        delay: float = min(self.cap_s, self.base_s * 2.0 ** min(self.attempts, 64))
        self.attempts += 1
        delay = delay / 2 + self.rng.uniform(0, delay / 2)
        if retry_after_s is not None:
            least = min(retry_after_s, self.retry_after_max_s)
            delay = max(delay, least + self.rng.uniform(0, least * RETRY_AFTER_JITTER))
        return delay

    def reset(self) -> None:
        self.attempts = 0


def _item_at(batch: dict[str, Any], loc: Any) -> Any:
    """The batch's item at an answer's ``loc`` (["records", 3]); None if it names none."""
    try:
        return batch[loc[0]][loc[1]]
    except (KeyError, IndexError, TypeError):
        return None


class Uploader:
    def __init__(
        self,
        spool: Spool,
        server: str,
        token: str,
        *,
        timeout_s: float = 10.0,
        interval_s: float = 5.0,
        backoff: Backoff | None = None,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        compress: bool = True,
    ) -> None:
        self.spool = spool
        self.url = server.rstrip("/") + INGEST_PATH
        self._token = token
        self.timeout_s, self.interval_s = timeout_s, interval_s
        self.backoff = backoff or Backoff()
        self._metrics = metrics or Metrics()
        self._clock, self._wall = clock, wall
        self.transport = Transport(self.url, timeout_s=timeout_s, compress=compress)
        self._due: float | None = None  # wall-clock time a sealed batch should be sent at
        self._cond = threading.Condition()

    def post(self, path: Path) -> Reply:
        batch = read_batch(path)
        # The spool's one-second records sent as runs: the same seconds and readings stored,
        # in fewer records. A sealed batch is read the same way at each try: the same body.
        batch["records"] = coalesce(batch["records"])
        raw = json.dumps(batch).encode()
        body, headers = self.transport.encode(raw)
        headers["Authorization"] = f"Bearer {self._token}"
        opened = self.transport.connections_opened
        try:
            response = self.transport.post(body, headers)
        except (OSError, http.client.HTTPException) as e:  # refused, reset, timeout, garbage
            log.warning("upload_failed", batch=path.name, error=repr(e))
            return Reply(Outcome.RETRY)
        finally:
            opened = self.transport.connections_opened - opened
            if opened:
                self._metrics.inc("gpumeter_agent_upload_connections_total", opened)
        self._metrics.inc("gpumeter_agent_upload_bytes_total", len(body))
        self._metrics.inc("gpumeter_agent_upload_uncompressed_bytes_total", len(raw))
        reply = self._judge(path, response.status, response.headers, response.body)
        if reply.outcome is Outcome.STORED:
            self._account_withheld(path, batch, response.body)
        return reply

    def _account_withheld(self, path: Path, batch: dict[str, Any], data: bytes) -> None:
        """Log and count the items the service held, and keep those it refused (with its
        answer) in the dead-letter folder: neither is re-sent, neither goes unseen."""
        try:
            answers = json.loads(data).get("not_stored") or []
        except (ValueError, AttributeError):
            return  # an answer without the list (an older service): all stored
        held = [a for a in answers if a.get("outcome") == Withheld.HELD]
        refused = [a for a in answers if a.get("outcome") != Withheld.HELD]
        if held:
            self._metrics.inc("gpumeter_agent_items_held_total", len(held))
            log.warning(
                "items_held",
                batch=path.name,
                count=len(held),
                gpus=sorted({a.get("gpu_uuid") for a in held}),
                reason=held[0].get("reason"),
            )
        if refused:
            items = [{**a, "item": _item_at(batch, a.get("loc"))} for a in refused]
            target = self.spool.dead_letter_items(path, items)
            self._metrics.inc("gpumeter_agent_items_refused_total", len(refused))
            log.error(
                "items_refused",
                batch=path.name,
                count=len(refused),
                path=str(target),
                reasons=sorted({str(a.get("reason")) for a in refused}),
            )

    def _judge(
        self, path: Path, status: int, headers: http.client.HTTPMessage, data: bytes
    ) -> Reply:
        if 200 <= status < 300:
            return Reply(Outcome.STORED)
        detail = data[:2000].decode(errors="replace")
        if 400 <= status < 500 and status not in RETRYABLE_4XX:
            log.error("batch_rejected", batch=path.name, status=status, detail=detail)
            return Reply(Outcome.REJECTED)
        wait = retry_after_seconds(headers.get("Retry-After"), time.time())
        if status in THROTTLED:
            self._metrics.inc("gpumeter_agent_upload_throttled_total")
        log.warning(
            "upload_failed", batch=path.name, status=status, retry_after_s=wait, detail=detail
        )
        return Reply(Outcome.RETRY, wait)

    def upload_pending(self, stop: threading.Event, deadline: float | None = None) -> bool:
        """Send every sealed batch; return True when the spool's batches are all sent."""
        while not stop.is_set():
            batches = self.spool.batches()
            if not batches:
                return True
            if deadline is not None and self._clock() >= deadline:
                return False
            path = batches[0]
            reply = self.post(path)
            if reply.outcome is Outcome.STORED:
                self.spool.remove(path)
                self.backoff.reset()
                self._metrics.inc("gpumeter_agent_batches_uploaded_total")
                self._metrics.set(
                    "gpumeter_agent_last_upload_success_timestamp_seconds", time.time()
                )
                log.debug("batch_uploaded", batch=path.name)
            elif reply.outcome is Outcome.REJECTED:
                target = self.spool.dead_letter(path)
                self._metrics.inc("gpumeter_agent_batches_dead_lettered_total")
                log.error("batch_dead_lettered", batch=path.name, path=str(target))
            else:
                self._metrics.inc("gpumeter_agent_upload_errors_total")
                delay = self.backoff.next_delay(reply.retry_after_s)
                if deadline is not None:
                    delay = min(delay, max(0.0, deadline - self._clock()))
                stop.wait(delay)
        return False

    def send_at(self, when: float) -> None:
        """Upload what is sealed at wall-clock time ``when`` (at once if it has passed)."""
        with self._cond:
            if self._due is None or when < self._due:
                self._due = when
            self._cond.notify()

    def wake(self) -> None:
        """Look at the spool now (a health event, shutdown)."""
        self.send_at(-math.inf)

    def _wait_for_due(self, stop: threading.Event) -> None:
        """Until a requested send time, or ``interval_s`` without any request, or stop."""
        with self._cond:
            while not stop.is_set():
                now = self._wall()
                if self._due is not None and self._due <= now:
                    self._due = None
                    return
                wait = self.interval_s if self._due is None else self._due - now
                notified = self._cond.wait(min(wait, self.interval_s))
                if not notified and self._due is None:
                    return  # a quiet interval: look for leftovers anyway

    def run(self, stop: threading.Event) -> None:
        """The uploader thread: send when asked (or every ``interval_s``) until stopped."""
        while not stop.is_set():
            try:
                self.upload_pending(stop)
            except Exception as e:  # keep uploading whatever one batch does
                log.error("uploader_error", error=repr(e))
            self._wait_for_due(stop)
        self.transport.close()
