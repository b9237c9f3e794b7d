"""Attribution: which rental held which GPU when. Services flush; the request commits."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from sqlalchemy import insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.auth.service import Principal
from app.core.errors import Conflict, Loc, NotFound, Unprocessable, not_found
from app.customers.models import Customer
from app.customers.service import customer_by_id
from app.events.service import publish
from app.rentals import reads, repository
from app.rentals.models import GpuAssignment, Migration, Rental
from app.rentals.ports import Catalogue, RentalGpu
from app.rentals.schemas import AssignmentCreate, Holding, MigrationCreate, RentalCreate


def get_rental(session: Session, rental_id: uuid.UUID, principal: Principal) -> Rental:
    rental = session.scalar(repository.readable_rentals(principal).where(Rental.id == rental_id))
    if rental is None:
        raise not_found("rental", rental_id)
    return rental


def display_name(rental: Rental, timezone: str) -> str:
    """What a person calls a rental: the name its customer gave it, else what it rents and
    when, ``1 \u00d7 H100, 2026-10-10 02:00 to 2026-10-12 02:00 CEST`` (or ``from ...``), in
    ``timezone``. The pages, the invoice document and its PDF all say this."""
    if rental.name is not None:
        return rental.name
    zone = ZoneInfo(timezone)
    start = rental.start_at.astimezone(zone)
    what = f"{rental.gpu_count} \u00d7 {rental.gpu_model}"
    if rental.end_at is None:
        return f"{what}, from {start:%Y-%m-%d %H:%M %Z}"
    return f"{what}, {start:%Y-%m-%d %H:%M} to {rental.end_at.astimezone(zone):%Y-%m-%d %H:%M %Z}"


def display_names(
    session: Session, customer_id: uuid.UUID, rental_ids: Collection[uuid.UUID], timezone: str
) -> dict[uuid.UUID, str]:
    """Each of the customer's ``rental_ids`` with its ``display_name`` (one query)."""
    if not rental_ids:
        return {}
    rentals = reads.rentals_of(session, customer_id, rental_ids)
    return {rental.id: display_name(rental, timezone) for rental in rentals}


def rental_by_id(session: Session, rental_id: uuid.UUID) -> Rental:
    """Read interface for the service's own rules (no caller to scope by): the rental."""
    return session.get_one(Rental, rental_id)


def rentals_holding(
    session: Session, gpu_uuid: str, start: datetime, end: datetime
) -> list[uuid.UUID]:
    """Read interface: the rentals that held the GPU at some time in [start, end)."""
    return repository.rentals_holding(session, gpu_uuid, start, end)


def holdings_at(session: Session, gpu_uuids: list[str], at: datetime) -> list[Holding]:
    """Read interface (spare pool): each GPU's holder at ``at`` and its next booking."""
    return repository.holdings_at(session, gpu_uuids, at)


def customer_migrations(
    session: Session, customer_id: uuid.UUID, start: datetime, end: datetime
) -> list[Migration]:
    """Read interface: the customer's migrations that failed over in [start, end)."""
    return list(session.scalars(repository.customer_migrations_query(customer_id, start, end)))


# Checks that may refuse a new rental (raising an ApiError), registered by the composition root
# (app.wiring): e.g. budgets' hard limit, which sits above rentals and so cannot be called here.
CreateCheck = Callable[[Session, Customer], None]
_create_checks: list[CreateCheck] = []


def add_create_check(check: CreateCheck) -> None:
    """Run ``check`` before every rental is created; idempotent."""
    if check not in _create_checks:
        _create_checks.append(check)


# Checks that may refuse assigning a GPU (raising an ApiError), registered by the composition
# root: e.g. the failover's spare reservations, which sit above rentals. Called with the GPU's
# row locked, so they see every assignment committed before.
AssignCheck = Callable[[Session, RentalGpu, Rental], None]
_assign_checks: list[AssignCheck] = []


def add_assign_check(check: AssignCheck) -> None:
    """Run ``check`` before every GPU is assigned to a rental; idempotent."""
    if check not in _assign_checks:
        _assign_checks.append(check)


# Where rentals look up the GPUs and plans they reference, set by the composition root.
_catalogues: list[Catalogue] = []


def use_catalogue(catalogue: Catalogue) -> None:
    _catalogues[:] = [catalogue]


def _catalogue() -> Catalogue:
    if not _catalogues:
        raise RuntimeError("no rentals catalogue: the composition root calls use_catalogue")
    return _catalogues[0]


def create_rental(session: Session, data: RentalCreate) -> Rental:
    customer = customer_by_id(session, data.customer_id)
    if customer is None:
        raise not_found("customer", data.customer_id, ("body", "customer_id"))
    for check in _create_checks:
        check(session, customer)
    plans = _catalogue().plans
    plan = plans.plan(session, data.plan_id)
    if plan is None:
        raise not_found("price plan", data.plan_id, ("body", "plan_id"))
    if plan.currency != customer.currency:
        raise Unprocessable(
            f"plan {plan.name!r} is priced in {plan.currency} but the customer is billed in "
            f"{customer.currency}",
            ("body", "plan_id"),
        )
    if not plans.has_price(
        session, data.plan_id, data.gpu_model, customer.id, preemptible=data.preemptible
    ):
        kind = "preemptible price" if data.preemptible else "price"
        raise Unprocessable(
            f"plan {plan.name!r} has no {kind} for GPU model {data.gpu_model!r}",
            ("body", "gpu_model"),
        )
    rental = Rental(**data.model_dump())
    session.add(rental)
    session.flush()
    return rental


def rename_rental(session: Session, rental: Rental, name: str | None) -> Rental:
    repository.rename(session, rental.id, name)
    session.refresh(rental)
    return rental


def end_rental(session: Session, rental: Rental, end_at: datetime) -> Rental:
    if rental.end_at is not None:
        raise Conflict(
            f"rental {rental.id} already ended at {rental.end_at.isoformat()}",
            ("path", "rental_id"),
        )
    if end_at <= rental.start_at:
        raise Unprocessable(
            f"end_at must be after the rental's start {rental.start_at.isoformat()}",
            ("body", "end_at"),
        )
    for assignment in rental.assignments:
        if assignment.start_at >= end_at:
            raise Conflict(
                f"assignment {assignment.id} of GPU {assignment.gpu_uuid} starts at "
                f"{assignment.start_at.isoformat()}, not before end_at; end it first",
                ("body", "end_at"),
            )
        if assignment.end_at is None or assignment.end_at > end_at:
            assignment.end_at = end_at
    rental.end_at = end_at
    session.flush()
    session.expire(rental, ["assignments"])
    return rental


def assign_gpu(session: Session, rental: Rental, data: AssignmentCreate) -> GpuAssignment:
    end_at = data.end_at or rental.end_at
    _check_assignable(session, rental, data.gpu_uuid, data.start_at, end_at, ("body",))
    assignment = GpuAssignment(
        rental_id=rental.id,
        customer_id=rental.customer_id,
        gpu_uuid=data.gpu_uuid,
        start_at=data.start_at,
        end_at=end_at,
    )
    _flush_assignment(session, assignment)
    session.expire(rental, ["assignments"])
    return assignment


def end_assignment(
    session: Session, rental: Rental, assignment_id: int, end_at: datetime
) -> GpuAssignment:
    assignment = session.get(GpuAssignment, assignment_id)
    if assignment is None or assignment.rental_id != rental.id:
        raise not_found("assignment", assignment_id, ("path", "assignment_id"))
    if end_at <= assignment.start_at:
        raise Unprocessable(
            f"end_at must be after the assignment's start {assignment.start_at.isoformat()}",
            ("body", "end_at"),
        )
    if assignment.end_at is not None and end_at > assignment.end_at:
        raise Conflict(
            f"assignment {assignment_id} already ended at {assignment.end_at.isoformat()}",
            ("body", "end_at"),
        )
    assignment.end_at = end_at
    session.flush()
    session.expire(rental, ["assignments"])
    return assignment


def migrate(session: Session, rental: Rental, data: MigrationCreate) -> Migration:
    """Move the rental off a failed GPU: close that assignment at failed_at, open one on the
    new GPU at resumed_at, and record [failed_at, resumed_at) as the migration window."""
    old = repository.assignment_covering(session, rental.id, data.from_gpu_uuid, data.failed_at)
    if old is None or old.start_at == data.failed_at:
        raise Conflict(
            f"GPU {data.from_gpu_uuid} is not assigned to rental {rental.id} at failed_at "
            f"{data.failed_at.isoformat()}",
            ("body", "from_gpu_uuid"),
        )
    original_end, old.end_at = old.end_at, data.failed_at
    session.flush()
    if original_end is not None and data.resumed_at >= original_end:
        raise Unprocessable(
            "resumed_at is after the failed assignment would have ended", ("body", "resumed_at")
        )
    _check_assignable(
        session,
        rental,
        data.to_gpu_uuid,
        data.resumed_at,
        original_end,
        ("body",),
        gpu_field="to_gpu_uuid",
    )
    _flush_assignment(
        session,
        GpuAssignment(
            rental_id=rental.id,
            customer_id=rental.customer_id,
            gpu_uuid=data.to_gpu_uuid,
            start_at=data.resumed_at,
            end_at=original_end,
        ),
    )
    migration = Migration(rental_id=rental.id, customer_id=rental.customer_id, **data.model_dump())
    session.add(migration)
    session.flush()
    session.expire(rental, ["assignments", "migrations"])
    _publish_migrated(session, rental, migration)
    return migration


def holder_at(session: Session, gpu_uuid: str, at: datetime) -> GpuAssignment | None:
    """Read interface: the assignment holding the GPU at ``at``, if any."""
    return repository.assignment_at(session, gpu_uuid, at)


def preemptible_seconds(
    session: Session, gpu_uuids: list[str], start: datetime, end: datetime
) -> int:
    """Read interface (spare pool view): seconds of [start, end) these GPUs were rented
    preemptibly."""
    return repository.preemptible_seconds(session, gpu_uuids, start, end)


def preempt(session: Session, rental: Rental, at: datetime, reason: str) -> Rental:
    """End a preemptible rental at ``at`` because its GPU is needed (a failover): it is never
    billed past that second, and it is an ending, not a failure credit. ``reason`` is what
    the ``rental.preempted`` event tells the rental's customer."""
    if not rental.preemptible:
        raise Conflict(f"rental {rental.id} is not preemptible", ("path", "rental_id"))
    gpus = [a.gpu_uuid for a in rental.assignments if a.end_at is None or a.end_at > at]
    end_rental(session, rental, at)
    rental.preempted_at = at
    session.flush()
    payload = {
        "rental_id": rental.id,
        "customer_id": rental.customer_id,
        "gpu_uuids": gpus,
        "preempted_at": at.isoformat(),
        "reason": reason,
    }
    publish(
        session,
        "rental.preempted",
        payload,
        subject=f"rental/{rental.id}",
        customer_id=rental.customer_id,
    )
    return rental


def _publish_migrated(session: Session, rental: Rental, migration: Migration) -> None:
    data = {
        "rental_id": rental.id,
        "migration_id": migration.id,
        "from_gpu_uuid": migration.from_gpu_uuid,
        "to_gpu_uuid": migration.to_gpu_uuid,
        "failed_at": migration.failed_at.isoformat(),
        "resumed_at": migration.resumed_at.isoformat(),
        "downtime_s": int((migration.resumed_at - migration.failed_at).total_seconds()),
        "reason": migration.reason,
    }
    subject, customer_id = f"rental/{rental.id}", rental.customer_id
    publish(session, "rental.migrated", data, subject=subject, customer_id=customer_id)


def _check_assignable(
    session: Session,
    rental: Rental,
    gpu_uuid: str,
    start: datetime,
    end: datetime | None,
    loc: Loc,
    *,
    gpu_field: str = "gpu_uuid",
) -> None:
    gpu = _catalogue().gpus.lock(session, gpu_uuid)
    if gpu is None:
        raise NotFound(f"GPU {gpu_uuid} not found", (*loc, gpu_field))
    if gpu.in_maintenance:
        raise Conflict(
            f"GPU {gpu_uuid} is in maintenance and cannot be assigned", (*loc, gpu_field)
        )
    if gpu.in_quarantine:
        raise Conflict(
            f"GPU {gpu_uuid} is in quarantine (its node reported it; no operator admitted it "
            f"yet): admit it first, PATCH /v1/gpus/{gpu_uuid} with pool rentable",
            (*loc, gpu_field),
        )
    for check in _assign_checks:
        check(session, gpu, rental)
    if gpu.model != rental.gpu_model:
        raise Conflict(
            f"GPU {gpu_uuid} is a {gpu.model!r}, but rental {rental.id} rents {rental.gpu_model!r}",
            (*loc, gpu_field),
        )
    # An open assignment of an ended rental ends with it: its start must come before that end.
    if (
        start < rental.start_at
        or (end is not None and start >= end)
        or (rental.end_at is not None and (end is None or end > rental.end_at))
    ):
        raise Unprocessable(
            f"the assignment must lie within the rental [{rental.start_at.isoformat()}, "
            f"{_iso_or(rental.end_at, 'open end')})",
            (*loc, "start_at"),
        )
    for other in repository.overlapping_assignments(session, gpu_uuid, start, end):
        raise Conflict(
            f"GPU {gpu_uuid} is assigned to rental {other.rental_id} from "
            f"{other.start_at.isoformat()} to {_iso_or(other.end_at, 'open end')}, "
            "which overlaps this interval",
            (*loc, gpu_field),
            extra={"conflicting_rental_id": str(other.rental_id)},
        )
    if repository.concurrent_assignment_count(session, rental.id, start, end) >= rental.gpu_count:
        raise Conflict(
            f"rental {rental.id} already holds {rental.gpu_count} GPU(s) in this interval",
            (*loc, gpu_field),
        )


def _flush_assignment(session: Session, assignment: GpuAssignment) -> None:
    try:
        with session.begin_nested():
            session.add(assignment)
            session.flush()
    except IntegrityError as error:
        # The database trigger caught an overlap a concurrent request committed meanwhile.
        raise Conflict(str(error.orig).splitlines()[0], ("body", "gpu_uuid")) from None


def _iso_or(moment: datetime | None, otherwise: str) -> str:
    return moment.isoformat() if moment is not None else otherwise


def changed_since(
    session: Session, customer_id: uuid.UUID, start: datetime, end: datetime, since: datetime
) -> bool:
    """Whether a rental, assignment or migration of the customer overlapping [start, end) was
    created or changed after ``since`` (billing: a correction to a finalized period)."""
    return repository.changed_since(session, customer_id, start, end, since)


# The fleet simulator's bulk writer, beside the rules above (it builds fleets whole).
def insert_rentals(
    session: Session, rentals: list[dict[str, Any]], assignments: list[dict[str, Any]]
) -> None:
    """Bulk insert (thousands of rows): rentals and their assignments as column-value dicts;
    the GPU-overlap trigger still checks every assignment."""
    session.execute(insert(Rental), rentals)
    session.execute(insert(GpuAssignment), assignments)
