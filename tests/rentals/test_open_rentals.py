"""Opening a batch of rentals with their GPUs (a Slurm snapshot's new jobs): the same answers,
rental by rental, as creating each and assigning its GPUs one after the other, in a handful of
statements for the whole batch."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, event, func, select
from sqlalchemy.orm import Session

from app.core.db import begun_session
from app.core.errors import ApiError
from app.rentals import repository, service
from app.rentals.models import GpuAssignment, Rental
from app.rentals.schemas import AssignmentCreate, RentalCreate
from tests.harness import Console

pytestmark = pytest.mark.xdist_group("open_rentals")  # one world for the module: see module_db

NOV_1 = datetime(2026, 11, 1, tzinfo=UTC)
HELD = "GPU-HELD"  # an earlier rental holds it from Nov 1 10:00 to 12:00
QUARANTINED = "GPU-Q"
A100 = "GPU-A100"
FREE = ["GPU-0", "GPU-1", "GPU-2"]
NOWHERE = "GPU-NONE"  # no such GPU


@dataclass(frozen=True)
class World:
    customer: uuid.UUID
    plan: uuid.UUID
    unpriced: uuid.UUID  # a plan with no H100 price


@pytest.fixture(scope="module")
def world(module_console: Console) -> World:
    console = module_console
    customer = console.customer()["id"]
    plan = console.plan()["id"]
    a100 = {"gpu_model": "A100", "price_per_hour": "1.10", "effective_from": "2026-01-01T00:00:00Z"}
    unpriced = console.post("/v1/plans", {"name": "A100 only", "prices": [a100]})["id"]
    node = console.node()["node"]["id"]
    for gpu in [HELD, *FREE]:
        console.gpu(node, gpu)
    console.gpu(node, QUARANTINED, pool="quarantine")
    console.post("/v1/gpus", {"uuid": A100, "node_id": node, "model": "A100", "pool": "rentable"})
    held = console.rental(customer, plan, start_at="2026-11-01T10:00:00Z",
                          end_at="2026-11-01T12:00:00Z")["id"]  # fmt: skip
    console.assign(held, HELD, "2026-11-01T10:00:00Z")
    return World(uuid.UUID(customer), uuid.UUID(plan), uuid.UUID(unpriced))


@pytest.fixture
def session(module_db: Engine) -> Iterator[Session]:
    """A transaction rolled back after the test: every example starts from the same world."""
    session = begun_session(module_db)
    try:
        yield session
    finally:
        session.rollback()
        session.close()


def body(world: World, start_h: int, hours: int | None, gpus: int, **fields: Any) -> RentalCreate:
    start = NOV_1 + timedelta(hours=start_h)
    return RentalCreate(
        customer_id=fields.pop("customer_id", world.customer),
        plan_id=fields.pop("plan_id", world.plan), gpu_model="H100", gpu_count=gpus,
        start_at=start, end_at=None if hours is None else start + timedelta(hours=hours),
        name="batch", **fields,
    )  # fmt: skip


@st.composite
def batches(draw: st.DrawFn, world: World) -> list[service.NewRental]:
    """Up to six new rentals, each asking one to three GPUs (free, held, quarantined, of
    another model, or none at all), at hours that overlap the held one's, some for more
    GPUs than they count, some of a customer or plan that cannot rent them."""
    items = []
    for _ in range(draw(st.integers(1, 6))):
        gpus = draw(st.lists(st.sampled_from([*FREE, HELD, QUARANTINED, A100, NOWHERE]),
                             min_size=1, max_size=3))  # fmt: skip
        fields: dict[str, Any] = draw(st.sampled_from([
            {}, {}, {}, {"customer_id": uuid.uuid4()}, {"plan_id": world.unpriced},
        ]))  # fmt: skip
        count = max(1, len(gpus) - draw(st.integers(0, 1)))
        data = body(world, draw(st.integers(8, 13)), draw(st.sampled_from([None, 1, 3])),
                    count, **fields)  # fmt: skip
        items.append(service.NewRental(data, gpus))
    return items


def one_by_one(session: Session, batch: list[service.NewRental]) -> list[Rental | ApiError]:
    """The reference: ``create_rental``, then ``assign_gpu`` for each GPU from the rental's
    start, each rental in a savepoint rolled back when any step refuses it."""
    answers: list[Rental | ApiError] = []
    for item in batch:
        try:
            with session.begin_nested():
                rental = service.create_rental(session, item.data)
                for gpu in item.gpu_uuids:
                    claim = AssignmentCreate(gpu_uuid=gpu, start_at=item.data.start_at)
                    service.assign_gpu(session, rental, claim)
        except ApiError as refused:
            answers.append(refused)
            continue
        answers.append(rental)
    return answers


UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def outcome(session: Session, answers: list[Rental | ApiError]) -> list[Any]:
    """Each answer as comparable across runs: the refusal (its kind, where and what, rental
    ids left out), or the rental's written assignments."""
    seen: list[Any] = []
    for answer in answers:
        if isinstance(answer, ApiError):
            [item] = answer.items
            seen.append((type(answer).__name__, item["loc"], UUID.sub("<id>", item["msg"])))
            continue
        rows = session.scalars(select(GpuAssignment).where(GpuAssignment.rental_id == answer.id))
        seen.append(sorted((a.gpu_uuid, a.start_at, a.end_at) for a in rows))
    return seen


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_a_batch_answers_as_one_rental_after_another(
    module_db: Engine, world: World, data: st.DataObject
) -> None:
    batch = data.draw(batches(world))
    answers = {}
    for how, opening in (("batch", service.open_rentals), ("one by one", one_by_one)):
        session = begun_session(module_db)
        try:
            answers[how] = outcome(session, opening(session, batch))
        finally:
            session.rollback()
            session.close()
    assert answers["batch"] == answers["one by one"]


def test_a_batch_takes_a_handful_of_statements_however_many_rentals(
    session: Session, world: World
) -> None:
    batch = [service.NewRental(body(world, 14 + i, 1, 1), [FREE[i % 3]]) for i in range(30)]
    statements = []
    engine = session.get_bind()
    record = lambda *args: statements.append(args[2])  # noqa: E731 - the statement's text
    event.listen(engine, "before_cursor_execute", record)
    try:
        answers = service.open_rentals(session, batch)
    finally:
        event.remove(engine, "before_cursor_execute", record)
    assert all(isinstance(a, Rental) for a in answers)
    assert len(statements) <= 12, statements  # customer, checks, plan, price, locks, writes
    opened = (
        select(func.count())
        .select_from(GpuAssignment)
        .where(GpuAssignment.rental_id.in_([a.id for a in answers if isinstance(a, Rental)]))
    )
    assert session.scalar(opened) == 30


def test_an_overlap_the_database_catches_refuses_the_whole_batch_and_writes_none_of_it(
    session: Session, world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A concurrent transaction's assignment, committed after the check read the GPU's
    assignments (here: a read that missed the held one): the overlap trigger refuses the
    insert, and every rental of the batch is refused with its message, none written."""
    monkeypatch.setattr(repository, "assignments_overlapping", lambda *args: [])
    rentals_before = session.scalar(select(func.count()).select_from(Rental))
    batch = [
        service.NewRental(body(world, 9, 2, 1), [FREE[0]]),
        service.NewRental(body(world, 11, 2, 1), [HELD]),  # overlaps the held rental
    ]
    answers = service.open_rentals(session, batch)
    assert [type(a).__name__ for a in answers] == ["Conflict", "Conflict"]
    assert all("overlap" in str(a) for a in answers), answers
    assert session.scalar(select(func.count()).select_from(Rental)) == rentals_before
