from __future__ import annotations

import uuid

from fastapi import APIRouter

from app.auth.deps import Admin, ConsoleUser
from app.core.deps import DbSession, RowId
from app.core.pagination import Page, Paging, paginate
from app.core.schemas import Instant
from app.rentals import repository, service
from app.rentals.schemas import (
    AssignmentCreate,
    AssignmentEnd,
    AssignmentRead,
    MigrationCreate,
    MigrationRead,
    RentalCreate,
    RentalEnd,
    RentalRead,
    RentalUpdate,
)

router = APIRouter(prefix="/v1/rentals", tags=["rentals"])


@router.post("", status_code=201)
def create_rental(body: RentalCreate, session: DbSession, _: Admin) -> RentalRead:
    return RentalRead.model_validate(service.create_rental(session, body))


@router.get("")
def list_rentals(
    session: DbSession,
    caller: ConsoleUser,
    page: Paging,
    customer_id: uuid.UUID | None = None,
    active_from: Instant | None = None,
    active_to: Instant | None = None,
) -> Page[RentalRead]:
    """Rentals overlapping [active_from, active_to); customers see only their own."""
    query = repository.rentals_query(
        caller, customer_id=customer_id, active_from=active_from, active_to=active_to
    )
    return paginate(session, query, page, RentalRead)


@router.get("/{rental_id}")
def read_rental(rental_id: uuid.UUID, session: DbSession, caller: ConsoleUser) -> RentalRead:
    """A rental with its assignment history and migrations."""
    return RentalRead.model_validate(service.get_rental(session, rental_id, caller))


@router.patch("/{rental_id}")
def rename_rental(
    rental_id: uuid.UUID, body: RentalUpdate, session: DbSession, caller: ConsoleUser
) -> RentalRead:
    """Name (or, with null, unname) a rental; a customer key renames only its own."""
    rental = service.get_rental(session, rental_id, caller)
    return RentalRead.model_validate(service.rename_rental(session, rental, body.name))


@router.post("/{rental_id}/end")
def end_rental(
    rental_id: uuid.UUID, body: RentalEnd, session: DbSession, admin: Admin
) -> RentalRead:
    rental = service.get_rental(session, rental_id, admin)
    return RentalRead.model_validate(service.end_rental(session, rental, body.end_at))


@router.post("/{rental_id}/assignments", status_code=201)
def assign_gpu(
    rental_id: uuid.UUID, body: AssignmentCreate, session: DbSession, admin: Admin
) -> AssignmentRead:
    rental = service.get_rental(session, rental_id, admin)
    return AssignmentRead.model_validate(service.assign_gpu(session, rental, body))


@router.post("/{rental_id}/assignments/{assignment_id}/end")
def end_assignment(
    rental_id: uuid.UUID,
    assignment_id: RowId,
    body: AssignmentEnd,
    session: DbSession,
    admin: Admin,
) -> AssignmentRead:
    """Unassign a GPU from the rental at end_at."""
    rental = service.get_rental(session, rental_id, admin)
    assignment = service.end_assignment(session, rental, assignment_id, body.end_at)
    return AssignmentRead.model_validate(assignment)


@router.post("/{rental_id}/migrations", status_code=201)
def migrate(
    rental_id: uuid.UUID, body: MigrationCreate, session: DbSession, admin: Admin
) -> MigrationRead:
    """Record a migration off a failed GPU; [failed_at, resumed_at) is credited."""
    rental = service.get_rental(session, rental_id, admin)
    return MigrationRead.model_validate(service.migrate(session, rental, body))


@router.get("/{rental_id}/migrations")
def list_migrations(
    rental_id: uuid.UUID, session: DbSession, caller: ConsoleUser, page: Paging
) -> Page[MigrationRead]:
    """The rental's migrations, oldest first, a page at a time."""
    rental = service.get_rental(session, rental_id, caller)
    return paginate(session, repository.migrations_query(rental.id), page, MigrationRead)
