"""The dashboard's own read: recent health events on the customer's GPUs while it rented them."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import BigInteger, cast, extract, func, select
from sqlalchemy.orm import Session

from app.core.epoch import from_epoch
from app.metering.models import HealthEventRow
from app.rentals.visibility import served


def latest_events(
    session: Session, customer_id: uuid.UUID, lo: int, hi: int, limit: int
) -> list[dict[str, Any]]:
    """Newest first: events of [lo, hi) on GPUs during the customer's assignments of them."""
    held = served(customer_id=customer_id, start=from_epoch(lo), end=from_epoch(hi)).subquery()
    held_from = func.greatest(cast(extract("epoch", held.c.start_at), BigInteger), lo)
    held_to = func.least(func.coalesce(cast(extract("epoch", held.c.end_at), BigInteger), hi), hi)
    e = HealthEventRow
    query = (
        select(e.event_id, e.gpu_uuid, e.at, e.kind, e.code, e.state, e.rule, e.detail)
        .add_columns(held.c.rental_id)
        .join(held, e.gpu_uuid == held.c.gpu_uuid)
        .where(e.at >= held_from, e.at < held_to)
        .order_by(e.at.desc(), e.event_id)
        .limit(limit)
    )
    return [dict(row._mapping) for row in session.execute(query)]
