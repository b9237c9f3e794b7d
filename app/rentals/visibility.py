"""Customer-GPU visibility: which GPUs served which rentals (and customers), and when; and
the plans a customer rents on.

The one definition of the rule, owned by rentals (assignments are its table) and used by every
reader: the fleet's GPU lists and telemetry, billing's rating and late-data checks, the
dashboard's events. A GPU is visible to a customer exactly while it was assigned to one of the
customer's rentals; the rows are those assignment intervals.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection
from datetime import datetime

from sqlalchemy import Exists, Select, exists, or_, select
from sqlalchemy.orm import InstrumentedAttribute

from app.rentals.models import GpuAssignment, Rental


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
