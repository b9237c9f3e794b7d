"""Failover's read interface: a customer's failovers over a window (the dashboard's timeline).

The rest of ``app.failover.repository`` is private to the package.
"""

from __future__ import annotations

import uuid

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.core.epoch import from_epoch
from app.failover.models import Failover


def failovers_of(
    session: Session, customer_id: uuid.UUID, lo: int, hi: int, limit: int
) -> list[Failover]:
    """The customer's failovers whose failure fell in [lo, hi), oldest first (the dashboard's
    failover timeline)."""
    query = (
        select(Failover)
        .where(
            Failover.customer_id == customer_id,
            Failover.failed_at >= from_epoch(lo),
            Failover.failed_at < from_epoch(hi),
        )
        .order_by(Failover.failed_at)
        .limit(limit)
    )
    return list(session.scalars(query))
