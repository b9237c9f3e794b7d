"""Group commit: batches stored together end exactly as stored one by one, outcome by outcome;
the writers form groups under load only, leave the unusual batches to be stored alone, fall
back to one by one when a group fails, bound every wait and stop on close."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from app.core.db import transaction
from app.core.errors import ApiError, ServiceUnavailable
from app.fleet.service import IngestGpus
from app.metering import service
from app.metering.group_commit import GroupCommit, unreachable
from app.metering.ports import GpuRegistry, LatestReport, StateChange
from app.metering.service import NodeBatch
from app.settings import Settings
from metering_agent.protocol import (
    EventKind,
    GpuState,
    HealthEvent,
    IngestBatch,
    IngestResult,
    UsageRecord,
)
from tests.metering.conftest import minute_ago

NODES = 3
STATES = (GpuState.HEALTHY, GpuState.DEGRADED, GpuState.FAILED)
BASE = minute_ago(30)
GPU_REGISTRY = IngestGpus.of(Settings())  # the fleet's, as app.main wires it


def node_id(n: int) -> uuid.UUID:
    return uuid.UUID(int=n + 1)


def gpu(n: int, g: int) -> str:
    return f"GPU-{n}-{g}"


def record(gpu_uuid: str, start: int, end: int, state: GpuState = GpuState.HEALTHY) -> UsageRecord:
    return UsageRecord(
        gpu_uuid=gpu_uuid,
        model="H100",
        start=start,
        end=end,
        state=state,
        sample_count=end - start,
        gpu_util_mean=40.0,
        gpu_util_max=80,
        mem_total_mib=81559,
    )


def batch(records: Iterable[UsageRecord], events: Sequence[HealthEvent] = ()) -> IngestBatch:
    return IngestBatch(uuid.uuid4().hex, list(records), list(events))


def add_nodes(session: Session, nodes: int = NODES) -> None:
    for n in range(nodes):
        session.execute(
            text("INSERT INTO nodes (id, hostname, datacenter) VALUES (:id, :h, 'test')"),
            {"id": node_id(n), "h": f"node-{n}"},
        )


def snapshot(session: Session) -> dict[str, list[tuple[Any, ...]]]:
    """What ingest stored, less the times of the transaction that stored it."""
    queries = {
        "segments": 'SELECT gpu_uuid, start, "end", state, evidence FROM gpu_state_segments',
        "open": "SELECT gpu_uuid, hour, slots, mem_total_mib FROM gpu_minute_metrics_open",
        "closed": "SELECT gpu_uuid, hour, slots, util_min_tenths FROM gpu_minute_metrics",
        "gpus": "SELECT uuid, node_id, model, last_state, last_seen_at FROM gpus",
        "events": "SELECT gpu_uuid, event_id, at, kind FROM health_events",
    }
    return {
        name: sorted(tuple(row) for row in session.execute(text(sql)))
        for name, sql in queries.items()
    }


Outcome = IngestResult | int  # the result, or the HTTP status of the error


def alone(session: Session, item: NodeBatch) -> Outcome:
    """As a writer stores a batch alone: its own transaction (here a savepoint)."""
    try:
        with session.begin_nested():
            return service.store_alone(session, item, GPU_REGISTRY)
    except ApiError as error:
        return error.status_code


@contextmanager
def rolled_back(db: Engine) -> Iterator[Session]:
    with db.connect() as connection:
        outer = connection.begin()
        session = Session(bind=connection, join_transaction_mode="create_savepoint")
        try:
            yield session
        finally:
            session.close()
            outer.rollback()


def stored(
    db: Engine, history: list[NodeBatch], nexts: list[NodeBatch], *, together: bool
) -> tuple[list[Outcome], dict[str, list[tuple[Any, ...]]]]:
    with rolled_back(db) as session:
        add_nodes(session)
        for item in history:
            alone(session, item)
        if together:
            with session.begin_nested():
                grouped = service.store_together(session, nexts, GPU_REGISTRY)
            outcomes = [
                alone(session, item) if result is None else result
                for item, result in zip(nexts, grouped, strict=True)
            ]
        else:
            outcomes = [alone(session, item) for item in nexts]
        return outcomes, snapshot(session)


# A node's records: (GPU index 0-2, where 2 is new to the service, or 3: node 0's GPU 0, of
# another node), start minute offset, length in seconds, state.
records_of = st.lists(
    st.tuples(
        st.integers(0, 3),
        st.integers(0, 6).map(lambda m: m * 60),
        st.sampled_from([1, 2, 30, 60, 90, 150]),
        st.sampled_from(STATES),
    ),
    max_size=4,
)


def node_batch(n: int, drawn: list[tuple[int, int, int, GpuState]], with_event: bool) -> NodeBatch:
    records = []
    for g, offset, length, state in drawn:
        name = gpu(0, 0) if g == 3 and n != 0 else gpu(n, min(g, 2))
        records.append(record(name, BASE + offset, BASE + offset + length, state))
    events = [HealthEvent(f"x-{n}", gpu(n, 0), BASE + 5, EventKind.XID, code=79)]
    return NodeBatch(node_id(n), batch(records, events if with_event else ()))


def valid(item: NodeBatch) -> bool:
    try:
        service.check_batch(item.batch, Settings(), BASE + 3600)
    except ApiError:
        return False
    return True


history_of = st.lists(
    st.tuples(
        st.integers(0, 1),
        st.integers(0, 6).map(lambda m: m * 60),
        st.sampled_from([30, 60, 120]),
        st.sampled_from(STATES),
    ),
    max_size=3,
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    history=st.lists(history_of, min_size=NODES, max_size=NODES),
    nexts=st.lists(st.tuples(records_of, st.booleans()), min_size=NODES, max_size=NODES),
)
def test_together_equals_one_by_one(
    db: Engine,
    history: list[list[tuple[int, int, int, GpuState]]],
    nexts: list[tuple[list[tuple[int, int, int, GpuState]], bool]],
) -> None:
    # Every node first registers its GPUs 0 and 1 and stores some history.
    first = [
        NodeBatch(node_id(n), batch(record(gpu(n, g), BASE - 60, BASE - 58) for g in (0, 1)))
        for n in range(NODES)
    ]
    past = [node_batch(n, drawn, False) for n, drawn in enumerate(history)]
    items = [node_batch(n, drawn, event) for n, (drawn, event) in enumerate(nexts)]
    items = [item for item in items if item.batch.records and valid(item)]
    history_items = first + [item for item in past if valid(item)]
    one_by_one = stored(db, history_items, items, together=False)
    together = stored(db, history_items, items, together=True)
    assert together == one_by_one


def registered(db: Engine, nodes: int = NODES) -> None:
    with transaction(db) as session:
        add_nodes(session, nodes)
        for n in range(nodes):
            item = NodeBatch(node_id(n), batch(record(gpu(n, g), BASE, BASE + 2) for g in (0, 1)))
            service.store_alone(session, item, GPU_REGISTRY)


def steady(n: int, second: int) -> NodeBatch:
    """Node ``n``'s next 2 s of its two GPUs, ``second`` s after BASE."""
    start = BASE + second
    return NodeBatch(node_id(n), batch(record(gpu(n, g), start, start + 2) for g in (0, 1)))


def test_the_unusual_batches_are_left_out_and_nothing_of_theirs_is_written(db: Engine) -> None:
    registered(db, 6)
    items = [
        steady(0, 2),
        NodeBatch(
            node_id(1),
            batch(
                [record(gpu(1, 0), BASE + 2, BASE + 4)],
                [HealthEvent("e-1", gpu(1, 0), BASE + 3, EventKind.XID, code=79)],
            ),
        ),
        NodeBatch(node_id(2), batch([record(gpu(2, 9), BASE + 2, BASE + 4)])),  # new GPU
        NodeBatch(node_id(3), batch([record(gpu(0, 0), BASE + 4, BASE + 6)])),  # node 0's
        NodeBatch(node_id(4), batch([record(gpu(4, 0), BASE, BASE + 2, GpuState.FAILED)])),
        steady(5, 2),
    ]
    with transaction(db) as session:
        results = service.store_together(session, items, GPU_REGISTRY)
    assert [r is not None for r in results] == [True, False, False, False, False, True]
    assert results[0] == IngestResult(items[0].batch.batch_id, 2, 0, 0, 0)
    with transaction(db) as session:
        touched = (
            session.execute(
                text("SELECT uuid FROM gpus WHERE last_seen_at > to_timestamp(:t) ORDER BY uuid"),
                {"t": BASE + 2},
            )
            .scalars()
            .all()
        )
        assert touched == [gpu(0, 0), gpu(0, 1), gpu(5, 0), gpu(5, 1)]
        assert session.scalar(text("SELECT count(*) FROM health_events")) == 0
        assert session.scalar(text("SELECT count(*) FROM gpus")) == 12  # GPU-2-9 not registered


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


def writers(db: Engine, gpus: GpuRegistry = GPU_REGISTRY, **kw: Any) -> GroupCommit:
    options: dict[str, Any] = {"writers": 1, "group_max": 32, "queue_max": 64, "wait_s": 10.0}
    return GroupCommit(db, gpus, **(options | kw))


class HeldLock:
    """A node's ingest lock, held by another transaction until released: a writer that takes
    that node's batch waits, and what arrives meanwhile queues up behind it."""

    def __init__(self, db: Engine, node: uuid.UUID) -> None:
        self.db, self.node = db, node
        self._acquired, self._released = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._hold)

    def _hold(self) -> None:
        with transaction(self.db) as session:
            session.execute(*service.repository.lock_nodes_statement([self.node]))
            self._acquired.set()
            self._released.wait(10)

    def __enter__(self) -> HeldLock:
        self._thread.start()
        assert self._acquired.wait(10)
        return self

    def release(self) -> None:
        self._released.set()
        self._thread.join(10)

    def __exit__(self, *exc: object) -> None:
        self.release()

    def waiters(self) -> int:
        """Transactions of this database waiting for an advisory lock."""
        with transaction(self.db) as session:
            return int(
                session.scalar(
                    text(
                        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT "
                        "granted AND database = (SELECT oid FROM pg_database "
                        "WHERE datname = current_database())"
                    )
                )
                or 0
            )


async def wait_until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


def _args(item: NodeBatch) -> tuple[uuid.UUID, IngestBatch]:
    return item.node_id, item.batch


async def behind_a_held_batch(
    group: GroupCommit, lock: HeldLock, items: list[NodeBatch]
) -> list[IngestResult | BaseException]:
    """Store ``items[0]`` (of the locked node) first; queue the rest while its writer waits on
    the lock; then release it. The outcomes, in order."""
    first = asyncio.create_task(group.store(*_args(items[0])))
    await wait_until(lambda: lock.waiters() == 1)
    rest = [asyncio.create_task(group.store(*_args(item))) for item in items[1:]]
    await wait_until(lambda: group.queued() == len(rest))
    await asyncio.to_thread(lock.release)
    return list(await asyncio.gather(first, *rest, return_exceptions=True))


def stored_behind_a_held_batch(
    db: Engine, items: list[NodeBatch], gpus: GpuRegistry = GPU_REGISTRY
) -> list[IngestResult | BaseException]:
    """``behind_a_held_batch`` with one writer, ``items[0]``'s node locked meanwhile."""
    group = writers(db, gpus)
    try:
        with HeldLock(db, items[0].node_id) as lock:
            return run(behind_a_held_batch(group, lock, items))
    finally:
        group.close(5)


def xmins(db: Engine, gpus: Iterable[str]) -> set[str]:
    """The transactions that last wrote these GPUs' rows."""
    with transaction(db) as session:
        rows = session.execute(
            text("SELECT xmin::text FROM gpus WHERE uuid = ANY(:u)"), {"u": list(gpus)}
        )
        return {x for (x,) in rows}


def accepted(outcomes: Iterable[IngestResult | BaseException]) -> list[int]:
    return [o.accepted if isinstance(o, IngestResult) else -1 for o in outcomes]


def test_batches_arriving_while_one_is_written_are_stored_in_one_transaction(db: Engine) -> None:
    registered(db, 5)
    outcomes = stored_behind_a_held_batch(db, [steady(n, 2) for n in range(5)])
    assert accepted(outcomes) == [2] * 5
    together = xmins(db, [gpu(n, g) for n in range(1, 5) for g in (0, 1)])
    assert len(together) == 1
    assert xmins(db, [gpu(0, 0)]).isdisjoint(together)


def test_a_node_s_second_batch_waits_for_the_next_group(db: Engine) -> None:
    registered(db, 2)
    outcomes = stored_behind_a_held_batch(db, [steady(0, 2), steady(1, 2), steady(1, 4)])
    assert accepted(outcomes) == [2, 2, 2]
    with transaction(db) as session:
        spans = session.execute(
            text('SELECT start, "end" FROM gpu_state_segments WHERE gpu_uuid = :g'),
            {"g": gpu(1, 0)},
        ).all()
    assert [tuple(s) for s in spans] == [(BASE, BASE + 6)]


class FailingGroups(IngestGpus):
    """The fleet's registry, failing whenever it records the state of more than one node."""

    def record_latest(self, session: Session, latest: dict[str, LatestReport]) -> list[StateChange]:
        if len({name.rsplit("-", 1)[0] for name in latest}) > 1:
            raise RuntimeError("injected: a group fails")
        return super().record_latest(session, latest)


def test_a_failed_group_is_stored_again_batch_by_batch(db: Engine) -> None:
    registered(db, 4)
    outcomes = stored_behind_a_held_batch(
        db, [steady(n, 2) for n in range(4)], FailingGroups.of(Settings())
    )
    assert accepted(outcomes) == [2] * 4
    assert len(xmins(db, [gpu(n, 0) for n in range(4)])) == 4  # each in its own transaction


def test_an_error_reaches_its_own_request_only(db: Engine) -> None:
    registered(db, 3)
    # Seconds stored healthy, reported failed: a conflict (409).
    contradicting = record(gpu(1, 0), BASE, BASE + 2, GpuState.FAILED)
    outcomes = stored_behind_a_held_batch(
        db, [steady(2, 2), steady(0, 2), NodeBatch(node_id(1), batch([contradicting]))]
    )
    assert accepted(outcomes)[:2] == [2, 2]
    refused = outcomes[2]
    assert isinstance(refused, ApiError) and refused.status_code == 409
    assert refused.items[0]["loc"] == ["body", "records", 0]


def test_a_batch_not_stored_in_time_is_a_503_and_is_stored_later(db: Engine) -> None:
    registered(db, 1)
    group = writers(db, wait_s=0.3)
    try:
        with (
            HeldLock(db, node_id(0)),
            pytest.raises(ServiceUnavailable, match=r"not stored within 0.3 s; re-send"),
        ):
            run(group.store(*_args(steady(0, 2))))
        run(wait_until(lambda: _last_end(db, gpu(0, 0)) == BASE + 4))
    finally:
        group.close(5)


def _last_end(db: Engine, gpu_uuid: str) -> int | None:
    with transaction(db) as session:
        end: int | None = session.scalar(
            text('SELECT max("end") FROM gpu_state_segments WHERE gpu_uuid = :g'),
            {"g": gpu_uuid},
        )
        return end


def test_a_full_queue_is_a_503(db: Engine) -> None:
    registered(db, 3)
    group = writers(db, queue_max=1)

    async def scenario(lock: HeldLock) -> list[IngestResult | BaseException]:
        first = asyncio.create_task(group.store(*_args(steady(0, 2))))
        await wait_until(lambda: lock.waiters() == 1)  # the writer took the first
        second = asyncio.create_task(group.store(*_args(steady(1, 2))))  # the one place
        await wait_until(lambda: group.queued() == 1)
        with pytest.raises(ServiceUnavailable, match="ingest queue is full"):
            await group.store(*_args(steady(2, 2)))
        await asyncio.to_thread(lock.release)
        return list(await asyncio.gather(first, second))

    try:
        with HeldLock(db, node_id(0)) as lock:
            assert accepted(run(scenario(lock))) == [2, 2]
    finally:
        group.close(5)


def test_close_stores_what_is_queued_then_refuses(db: Engine) -> None:
    registered(db, 2)
    group = writers(db)

    async def scenario() -> list[IngestResult]:
        tasks = [asyncio.create_task(group.store(*_args(steady(n, 2)))) for n in range(2)]
        await asyncio.sleep(0)  # both are queued
        await asyncio.to_thread(group.close, 5)
        assert not group.writing()
        return [await task for task in tasks]

    assert accepted(run(scenario())) == [2, 2]
    with pytest.raises(ServiceUnavailable, match="shutting down"):
        run(group.store(*_args(steady(0, 4))))


def test_only_anunreachable_database_skips_the_one_by_one_retry() -> None:
    lost = OperationalError("SELECT 1", {}, Exception("server closed the connection"))
    lost.connection_invalidated = True
    assert unreachable(lost)
    assert not unreachable(OperationalError("SELECT 1", {}, Exception("deadlock detected")))
    assert not unreachable(RuntimeError("a bug"))
