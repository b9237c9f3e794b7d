"""Group commit for ingest: batches that arrive while others are being written are stored
together, in one transaction with one set of statements (``service.store_together``).

Why: most of a small batch's cost is per transaction and per statement, not per record. In
process, with the same 8-GPU batches, stored one per transaction: 4.4 ms of Python and 3.8 ms
of Postgres CPU each; ten to a transaction: 1.8 and 1.6 ms (``bench/HISTORY.md``).

Each worker process runs ``ingest_writers`` threads over one bounded queue. A writer takes
the oldest waiting batch and whatever else is waiting (up to ``ingest_group_max``, one batch
per node), so groups form only under load: a lone batch is written at once, alone, exactly
as before. Outcomes stay per batch. A batch with anything unusual (health events, GPUs new
to the service, of another node or in dispute, records that contradict stored seconds) is
left out of the group and stored alone after it, with its own answer and errors; a group
that fails is stored again batch by batch, unless the database is unreachable (then every
batch of it gets that 503). The request waits at most ``ingest_wait_s`` for its batch's outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field

from prometheus_client import Histogram
from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from app.core.db import transaction
from app.core.errors import SHUTTING_DOWN, ServiceUnavailable
from app.metering import service
from app.metering.ports import GpuRegistry
from app.metering.service import NodeBatch
from app.settings import Settings
from metering_agent.protocol import IngestBatch, IngestResult

log = logging.getLogger(__name__)

POLL_S = 0.25  # how often an idle writer looks whether it should stop
GROUP_BATCHES = Histogram(
    "gpumeter_ingest_group_batches",
    "Ingest batches a writer took together (stored in one transaction, but for those left out).",
    buckets=(1, 2, 4, 8, 16, 32, 64),
)


@dataclass(slots=True)
class _Waiting:
    """A batch and the request waiting for its outcome (on that request's event loop)."""

    item: NodeBatch
    loop: asyncio.AbstractEventLoop
    outcome: asyncio.Future[IngestResult] = field(init=False)

    def __post_init__(self) -> None:
        self.outcome = self.loop.create_future()

    def settle(self, outcome: IngestResult | BaseException) -> None:
        """Hand the request its batch's result, or the error it raises."""

        def deliver() -> None:
            if self.outcome.done():
                return
            if isinstance(outcome, BaseException):
                self.outcome.set_exception(outcome)
            else:
                self.outcome.set_result(outcome)

        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits any more
            self.loop.call_soon_threadsafe(deliver)


@dataclass
class GroupCommit:
    engine: Engine
    gpus: GpuRegistry
    writers: int
    group_max: int
    queue_max: int
    wait_s: float
    _queue: queue.Queue[_Waiting] = field(init=False)
    _threads: list[threading.Thread] = field(init=False, default_factory=list)
    _lock: threading.Lock = field(init=False, default_factory=threading.Lock)
    _closed: threading.Event = field(init=False, default_factory=threading.Event)

    def __post_init__(self) -> None:
        self._queue = queue.Queue(self.queue_max)

    @classmethod
    def of(cls, engine: Engine, gpus: GpuRegistry, settings: Settings) -> GroupCommit:
        return cls(
            engine,
            gpus,
            writers=settings.ingest_writers,
            group_max=settings.ingest_group_max,
            queue_max=settings.ingest_in_flight,  # a worker never runs more ingest requests
            wait_s=settings.ingest_wait_s,
        )

    async def store(self, node_id: uuid.UUID, batch: IngestBatch) -> IngestResult:
        """Store a checked batch (alone or with others); its outcome, or its error raised."""
        self._start()
        waiting = _Waiting(NodeBatch(node_id, batch), asyncio.get_running_loop())
        try:
            self._queue.put_nowait(waiting)
        except queue.Full:
            raise ServiceUnavailable("the ingest queue is full; retry later") from None
        try:
            # A timeout cancels the outcome; the writer's later settle then finds it done.
            # (asyncio.timeout, not wait_for: no task of its own per request.)
            async with asyncio.timeout(self.wait_s):
                return await waiting.outcome
        except TimeoutError:
            raise ServiceUnavailable(
                f"the batch was not stored within {self.wait_s} s; re-send it (what was stored"
                " meanwhile counts as duplicates)"
            ) from None

    def queued(self) -> int:
        """Batches waiting for a writer."""
        return self._queue.qsize()

    def writing(self) -> bool:
        """Whether any writer thread runs."""
        return any(thread.is_alive() for thread in self._threads)

    def close(self, timeout_s: float) -> None:
        """Stop taking batches; the writers store what is queued and stop, within
        ``timeout_s`` (then they are left: daemon threads end with the process)."""
        self._closed.set()
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _start(self) -> None:
        if self._closed.is_set():
            raise ServiceUnavailable(SHUTTING_DOWN)
        if self._threads:
            return
        with self._lock:
            if not self._threads:  # started on first use: after uvicorn forked the worker
                for n in range(self.writers):
                    thread = threading.Thread(
                        target=self._write_forever, name=f"ingest-writer-{n}", daemon=True
                    )
                    thread.start()
                    self._threads.append(thread)

    def _write_forever(self) -> None:
        carried: list[_Waiting] = []
        while True:
            group, carried = self._next_group(carried)
            if group:
                self._write(group)
            elif self._closed.is_set():
                return

    def _next_group(self, carried: list[_Waiting]) -> tuple[list[_Waiting], list[_Waiting]]:
        """The batches carried over, then what waits, up to ``group_max`` in all and one per
        node (a node's next batch must see its last); the rest is carried to the next group."""
        waiting = list(carried)
        if not waiting:
            try:
                waiting.append(self._queue.get(timeout=POLL_S))
            except queue.Empty:
                return [], []
        while len(waiting) < self.group_max:
            try:
                waiting.append(self._queue.get_nowait())
            except queue.Empty:
                break
        group: list[_Waiting] = []
        nodes: set[uuid.UUID] = set()
        rest: list[_Waiting] = []
        for item in waiting:
            if item.item.node_id in nodes:
                rest.append(item)
            else:
                nodes.add(item.item.node_id)
                group.append(item)
        return group, rest

    def _write(self, group: list[_Waiting]) -> None:
        GROUP_BATCHES.observe(len(group))
        if len(group) == 1:
            self._write_alone(group[0])
            return
        try:
            with transaction(self.engine) as session:
                results = service.store_together(session, [w.item for w in group], self.gpus)
        except Exception as error:  # every batch gets its own outcome below
            if unreachable(error):
                for waiting in group:
                    waiting.settle(error)
                return
            log.warning("ingest group failed; storing its batches one by one", exc_info=True)
            results = [None] * len(group)
        for waiting, result in zip(group, results, strict=True):
            if result is None:
                self._write_alone(waiting)
            else:
                waiting.settle(result)

    def _write_alone(self, waiting: _Waiting) -> None:
        try:
            with transaction(self.engine) as session:
                result = service.store_alone(session, waiting.item, self.gpus)
        except Exception as error:  # the request raises it
            waiting.settle(error)
        else:
            waiting.settle(result)


def unreachable(error: Exception) -> bool:
    """The database could not be reached (no pooled connection in time, or it went away):
    storing batch by batch would only wait as long again per batch."""
    return isinstance(error, PoolTimeout) or (
        isinstance(error, DBAPIError) and error.connection_invalidated
    )
