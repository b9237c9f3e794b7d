"""The fleet's read interface: GPUs' places and counts, spares, maintenance spans, as billing,
the dashboard and the simulator read them.

The rest of ``app.fleet.repository`` is private to the package.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from typing import Any

from sqlalchemy import Text, and_, cast, func, or_, select
from sqlalchemy.orm import Session

from app.core.db import one_of
from app.fleet.models import Gpu, MaintenanceWindow, Node, Pool
from app.rentals.reads import served


def maintenance_spans(
    session: Session, gpu_uuids: list[str], start: datetime, end: datetime
) -> list[tuple[str, datetime, datetime | None]]:
    """(GPU, start, end or None while open) of the GPUs' windows overlapping [start, end)."""
    rows = session.execute(
        select(
            MaintenanceWindow.gpu_uuid, MaintenanceWindow.start_at, MaintenanceWindow.end_at
        ).where(
            # One array parameter, not one per GPU: a 3,000-GPU customer's IN list cost more
            # to build and send than the query took.
            one_of(MaintenanceWindow.gpu_uuid, gpu_uuids),
            MaintenanceWindow.start_at < end,
            or_(MaintenanceWindow.end_at.is_(None), MaintenanceWindow.end_at > start),
        )
    )
    return [(gpu, window_start, window_end) for gpu, window_start, window_end in rows]


def fleet_counts(session: Session) -> list[dict[str, Any]]:
    """GPUs per model, datacenter, pool, last state and whether a rental holds one now."""
    held = served().subquery()
    keys = (
        Gpu.model,
        Node.datacenter,
        cast(Gpu.pool, Text).label("pool"),
        func.coalesce(Gpu.last_state, "unknown").label("state"),
        held.c.gpu_uuid.is_not(None).label("rented"),
    )
    query = (
        select(*keys, func.count().label("gpus"))
        .join(Node, Node.id == Gpu.node_id)
        .outerjoin(held, and_(held.c.gpu_uuid == Gpu.uuid, held.c.end_at.is_(None)))
        .group_by(*keys)
        .order_by(*keys)
    )
    return [dict(r._mapping) for r in session.execute(query)]


def gpu_places(session: Session, gpu_uuids: Collection[str]) -> dict[str, tuple[str, str]]:
    """Each GPU's model and datacenter."""
    query = select(Gpu.uuid, Gpu.model, Node.datacenter).join(Node, Node.id == Gpu.node_id)
    rows = session.execute(query.where(Gpu.uuid.in_(gpu_uuids)))
    return {gpu: (model, datacenter) for gpu, model, datacenter in rows}


def spare_uuids(session: Session, gpu_uuids: list[str]) -> set[str]:
    """Those of the GPUs in the spare pool."""
    query = select(Gpu.uuid).where(Gpu.uuid.in_(gpu_uuids), Gpu.pool == Pool.SPARE)
    return set(session.scalars(query))
