from __future__ import annotations

import uuid
from collections.abc import Collection, Sequence
from datetime import datetime

from sqlalchemy import (
    ColumnElement,
    Select,
    exists,
    func,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.orm import Session, selectinload

from app.auth.service import Principal
from app.core.db import one_of
from app.rentals.models import GpuAssignment, Migration, Rental
from app.rentals.schemas import Holding


def readable_rentals(principal: Principal) -> Select[Rental]:
    """Every rental the principal may read (all for an admin, its own for a customer key);
    every list and get of rentals starts here."""
    query = select(Rental)
    scope = principal.customer_scope
    return query if scope is None else query.where(Rental.customer_id == scope)


def rename(session: Session, rental_id: uuid.UUID, name: str | None) -> None:
    """Set the rental's name. ``changed_at`` keeps its value: a name is no billing change, so
    a rename never makes a finalized month look changed."""
    session.execute(
        update(Rental).where(Rental.id == rental_id).values(name=name, changed_at=Rental.changed_at)
    )


def rentals_query(
    principal: Principal,
    *,
    customer_id: uuid.UUID | None = None,
    active_from: datetime | None = None,
    active_to: datetime | None = None,
) -> Select[Rental]:
    """The principal's rentals, optionally of one customer and overlapping
    [active_from, active_to)."""
    query = readable_rentals(principal).order_by(Rental.start_at, Rental.id)
    if customer_id is not None:
        query = query.where(Rental.customer_id == customer_id)
    if active_to is not None:
        query = query.where(Rental.start_at < active_to)
    if active_from is not None:
        query = query.where(or_(Rental.end_at.is_(None), Rental.end_at > active_from))
    return query


def migrations_query(rental_id: uuid.UUID) -> Select[Migration]:
    """A rental's migrations, oldest first (as the rental's own list orders them)."""
    return (
        select(Migration)
        .where(Migration.rental_id == rental_id)
        .order_by(Migration.failed_at, Migration.id)
    )


def customer_migrations_query(
    customer_id: uuid.UUID, start: datetime, end: datetime
) -> Select[Migration]:
    """The customer's migrations that failed over in [start, end), oldest first."""
    return (
        select(Migration)
        .where(
            Migration.customer_id == customer_id,
            Migration.failed_at >= start,
            Migration.failed_at < end,
        )
        .order_by(Migration.failed_at, Migration.id)
    )


def assignments_overlapping(
    session: Session, gpu_uuids: Collection[str], start: datetime, end: datetime | None
) -> Sequence[GpuAssignment]:
    """The assignments of these GPUs that overlap [start, end), earliest first."""
    query = select(GpuAssignment).where(
        one_of(GpuAssignment.gpu_uuid, gpu_uuids),
        or_(GpuAssignment.end_at.is_(None), GpuAssignment.end_at > start),
    )
    if end is not None:
        query = query.where(GpuAssignment.start_at < end)
    return session.scalars(query.order_by(GpuAssignment.start_at, GpuAssignment.id)).all()


def with_assignments(session: Session, rental_ids: Collection[uuid.UUID]) -> Sequence[Rental]:
    """These rentals, their assignments loaded (two queries, however many)."""
    query = select(Rental).where(one_of(Rental.id, rental_ids))
    return session.scalars(query.options(selectinload(Rental.assignments))).all()


def concurrent_assignment_count(
    session: Session, rental_id: uuid.UUID, start: datetime, end: datetime | None
) -> int:
    """Most of the rental's assignments that overlap [start, end) — an upper bound is enough."""
    query = select(func.count()).where(
        GpuAssignment.rental_id == rental_id,
        or_(GpuAssignment.end_at.is_(None), GpuAssignment.end_at > start),
    )
    if end is not None:
        query = query.where(GpuAssignment.start_at < end)
    return session.scalar(query) or 0


def assignment_covering(
    session: Session, rental_id: uuid.UUID, gpu_uuid: str, at: datetime
) -> GpuAssignment | None:
    return session.scalar(
        select(GpuAssignment).where(
            GpuAssignment.rental_id == rental_id,
            GpuAssignment.gpu_uuid == gpu_uuid,
            GpuAssignment.start_at <= at,
            or_(GpuAssignment.end_at.is_(None), GpuAssignment.end_at > at),
        )
    )


def assignment_at(session: Session, gpu_uuid: str, at: datetime) -> GpuAssignment | None:
    return session.scalar(
        select(GpuAssignment).where(
            GpuAssignment.gpu_uuid == gpu_uuid,
            GpuAssignment.start_at <= at,
            or_(GpuAssignment.end_at.is_(None), GpuAssignment.end_at > at),
        )
    )


def preemptible_seconds(
    session: Session, gpu_uuids: Sequence[str], start: datetime, end: datetime
) -> int:
    """Seconds of [start, end) the GPUs were held by preemptible rentals."""
    lo, hi = (
        func.greatest(GpuAssignment.start_at, start),
        func.least(func.coalesce(GpuAssignment.end_at, end), end),
    )
    query = (
        select(func.coalesce(func.sum(func.extract("epoch", hi - lo)), 0))
        .join(Rental, Rental.id == GpuAssignment.rental_id)
        .where(
            Rental.preemptible,
            GpuAssignment.gpu_uuid.in_(gpu_uuids),
            GpuAssignment.start_at < end,
            or_(GpuAssignment.end_at.is_(None), GpuAssignment.end_at > start),
        )
    )
    return int(session.scalar(query) or 0)


def changed_since(
    session: Session, customer_id: uuid.UUID, start: datetime, end: datetime, since: datetime
) -> bool:
    def overlapping(model: type[Rental] | type[GpuAssignment]) -> ColumnElement[bool]:
        return exists().where(
            model.customer_id == customer_id,
            model.start_at < end,
            or_(model.end_at.is_(None), model.end_at > start),
            model.changed_at > since,
        )

    migrated = exists().where(
        Migration.customer_id == customer_id,
        Migration.failed_at < end,
        Migration.resumed_at > start,
        Migration.created_at > since,
    )
    query = select(or_(overlapping(Rental), overlapping(GpuAssignment), migrated))
    return bool(session.scalar(query))


def rentals_holding(
    session: Session, gpu_uuid: str, start: datetime, end: datetime
) -> list[uuid.UUID]:
    """The rentals that held the GPU at some time in [start, end)."""
    query = (
        select(GpuAssignment.rental_id)
        .distinct()
        .where(
            GpuAssignment.gpu_uuid == gpu_uuid,
            GpuAssignment.start_at < end,
            (GpuAssignment.end_at.is_(None)) | (GpuAssignment.end_at > start),
        )
    )
    return sorted(session.scalars(query))


def holdings_at(session: Session, gpu_uuids: list[str], at: datetime) -> list[Holding]:
    """Each GPU's holder at ``at`` (the rental, whether it is preemptible, since when) and the
    start of its first assignment after ``at``, in ``gpu_uuids``' order."""
    rows = session.execute(
        text("""
        SELECT a.rental_id, r.preemptible, a.start_at,
               (SELECT min(later.start_at) FROM gpu_assignments later
                WHERE later.gpu_uuid = g.uuid AND later.start_at > :at)
        FROM unnest(CAST(:gpus AS text[])) WITH ORDINALITY AS g(uuid, n)
        LEFT JOIN gpu_assignments a ON a.gpu_uuid = g.uuid AND a.start_at <= :at
             AND (a.end_at IS NULL OR a.end_at > :at)
        LEFT JOIN rentals r ON r.id = a.rental_id
        ORDER BY g.n
        """),
        {"gpus": gpu_uuids, "at": at},
    )
    return [Holding(*row) for row in rows]
