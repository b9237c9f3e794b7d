"""Rentals' read interface: customer-GPU visibility (which GPUs served which rentals and
customers, and when; the plans a customer rents on), and the rentals, migrations and moves
billing's loader and the dashboard read. The rest of ``app.rentals.repository`` is private.

The one definition of the rule, owned by rentals (assignments are its table) and used by every
reader: the fleet's GPU lists and telemetry, billing's rating and late-data checks, the
dashboard's events. A GPU is visible to a customer exactly while it was assigned to one of the
customer's rentals; the rows are those assignment intervals.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection
from datetime import datetime

from sqlalchemy import Exists, Select, exists, or_, select, text
from sqlalchemy.orm import InstrumentedAttribute, Session, lazyload

from app.core.db import one_of
from app.rentals.models import GpuAssignment, Migration, Rental


def served(
    *,
    customer_id: uuid.UUID | None = None,
    rental_ids: Collection[uuid.UUID] | None = None,
    gpu_uuids: Collection[str] | None = None,
    start: datetime | None = None,
    end: datetime | None = None,
) -> Select[uuid.UUID, uuid.UUID, str, datetime, datetime | None]:
    """Assignment intervals ``(rental_id, customer_id, gpu_uuid, start_at, end_at)`` (``end_at``
    None while it runs), filtered by what is given and overlapping [start, end) if given."""
    query = select(
        GpuAssignment.rental_id,
        GpuAssignment.customer_id,
        GpuAssignment.gpu_uuid,
        GpuAssignment.start_at,
        GpuAssignment.end_at,
    )
    if customer_id is not None:
        query = query.where(GpuAssignment.customer_id == customer_id)
    if rental_ids is not None:
        query = query.where(GpuAssignment.rental_id.in_(rental_ids))
    if gpu_uuids is not None:
        query = query.where(GpuAssignment.gpu_uuid.in_(gpu_uuids))
    if end is not None:
        query = query.where(GpuAssignment.start_at < end)
    if start is not None:
        query = query.where(or_(GpuAssignment.end_at.is_(None), GpuAssignment.end_at > start))
    return query


def ever_served(customer_id: uuid.UUID, gpu_uuid: InstrumentedAttribute[str]) -> Exists:
    """Whether the GPU ``gpu_uuid`` (a column of the enclosing query) ever served one of the
    customer's rentals."""
    return served(customer_id=customer_id).where(GpuAssignment.gpu_uuid == gpu_uuid).exists()


def rents_on(customer_id: uuid.UUID, plan_id: InstrumentedAttribute[uuid.UUID]) -> Exists:
    """Whether the customer has a rental on the plan ``plan_id`` (a column of the enclosing
    query): the plans a customer may read."""
    return exists().where(Rental.plan_id == plan_id, Rental.customer_id == customer_id)


def rentals_of(
    session: Session, customer_id: uuid.UUID, rental_ids: Collection[uuid.UUID]
) -> list[Rental]:
    """The customer's rentals among ``rental_ids`` (for their names and descriptions)."""
    query = (
        select(Rental)
        .where(Rental.customer_id == customer_id, Rental.id.in_(rental_ids))
        .options(lazyload(Rental.assignments), lazyload(Rental.migrations))
    )
    return list(session.scalars(query))


def rentals_overlapping(
    session: Session,
    customer_ids: Collection[uuid.UUID],
    start: datetime,
    end: datetime,
    rental_ids: Collection[uuid.UUID] | None = None,
) -> list[Rental]:
    """Rentals of ``customer_ids`` overlapping [start, end) (optionally only ``rental_ids``),
    by customer and start."""
    query = (
        select(Rental)
        .where(
            Rental.customer_id.in_(customer_ids),
            Rental.start_at < end,
            or_(Rental.end_at.is_(None), Rental.end_at > start),
        )
        # The caller reads assignments and migrations in one query each, not per rental.
        .options(lazyload(Rental.assignments), lazyload(Rental.migrations))
        .order_by(Rental.customer_id, Rental.start_at, Rental.id)
    )
    if rental_ids is not None:
        query = query.where(Rental.id.in_(rental_ids))
    return list(session.scalars(query))


def migrations_overlapping(
    session: Session, rental_ids: list[uuid.UUID], start: datetime, end: datetime
) -> list[Migration]:
    """The rentals' migrations whose [failed_at, resumed_at) overlaps [start, end)."""
    return list(
        session.scalars(
            select(Migration).where(
                one_of(Migration.rental_id, rental_ids),
                Migration.failed_at < end,
                Migration.resumed_at > start,
            )
        )
    )


# When a rental was moved off a GPU after it failed at ``at`` (within a day), when that rental
# resumed on its new GPU.
_MOVED_AFTER = text("""
SELECT f.gpu, f.at, extract(epoch FROM m.resumed_at)::bigint AS resumed_s, m.to_gpu_uuid
FROM unnest(CAST(:g AS text[]), CAST(:a AS bigint[])) AS f(gpu, at)
JOIN LATERAL (
  SELECT resumed_at, to_gpu_uuid FROM rental_migrations
  WHERE from_gpu_uuid = f.gpu AND failed_at >= to_timestamp(f.at)
    AND failed_at < to_timestamp(f.at) + interval '1 day'
  ORDER BY failed_at LIMIT 1
) m ON true
""")


def moved_after(
    session: Session, failures: Collection[tuple[str, int]]
) -> dict[tuple[str, int], tuple[int, str]]:
    """For each (GPU, failure second), the first migration off that GPU in the day after it:
    (resumed second, the GPU it moved to); failures nothing moved after are left out."""
    params = {"g": [gpu for gpu, _ in failures], "a": [at for _, at in failures]}
    rows = session.execute(_MOVED_AFTER, params)
    return {(gpu, at): (resumed_s, to_gpu) for gpu, at, resumed_s, to_gpu in rows}
