"""The dashboard's own read: recent health events on the customer's GPUs while it rented them.

An assignment's end second is included: a migration ends the failed GPU's assignment at
``failed_at``, the very second of the failure event that caused it.
"""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import BigInteger, cast, extract, func, or_, select, text
from sqlalchemy.orm import Session

from app.core.epoch import from_epoch
from app.failover.models import Failover
from app.metering.models import HealthEventRow
from app.rentals.visibility import served


def latest_events(
    session: Session,
    customer_id: uuid.UUID,
    lo: int,
    hi: int,
    limit: int,
    *,
    failures_only: bool = False,
) -> list[dict[str, Any]]:
    """Newest first: events of [lo, hi) on GPUs during (or ending) the customer's assignments;
    with ``failures_only``, only the state changes to ``failed``."""
    held = served(customer_id=customer_id, start=from_epoch(lo), end=from_epoch(hi)).subquery()
    held_from = func.greatest(cast(extract("epoch", held.c.start_at), BigInteger), lo)
    held_end = cast(extract("epoch", held.c.end_at), BigInteger)
    e = HealthEventRow
    received_s = cast(extract("epoch", e.received_at), BigInteger).label("received_s")
    query = (
        select(e.event_id, e.gpu_uuid, e.at, e.kind, e.code, e.state, e.rule, e.detail)
        .add_columns(held.c.rental_id, received_s)
        .join(held, e.gpu_uuid == held.c.gpu_uuid)
        .where(e.at >= held_from, e.at < hi, or_(held.c.end_at.is_(None), e.at <= held_end))
        .order_by(e.at.desc(), e.event_id)
        .limit(limit)
    )
    if failures_only:
        query = query.where(e.kind == "state_change", e.state == "failed")
    return [dict(row._mapping) for row in session.execute(query)]


# --- operators: the fleet and revenue ------------------------------------------------------

_FLEET_COUNTS = text("""
SELECT g.model, n.datacenter, g.pool::text AS pool, COALESCE(g.last_state, 'unknown') AS state,
  (a.gpu_uuid IS NOT NULL) AS rented, count(*) AS gpus
FROM gpus g
JOIN nodes n ON n.id = g.node_id
LEFT JOIN gpu_assignments a ON a.gpu_uuid = g.uuid AND a.end_at IS NULL
GROUP BY 1, 2, 3, 4, 5
ORDER BY 1, 2, 3, 4, 5
""")

# Failures since :since, each with when the service heard of it and, when a rental was moved
# off the GPU after it, when that rental resumed on its new GPU.
_FAILURES = text("""
SELECT e.event_id, e.gpu_uuid, g.model, n.datacenter, e.at, e.code, e.rule, e.detail,
  extract(epoch FROM e.received_at)::bigint AS received_s,
  extract(epoch FROM m.resumed_at)::bigint AS resumed_s, m.to_gpu_uuid
FROM health_events e
JOIN gpus g ON g.uuid = e.gpu_uuid
JOIN nodes n ON n.id = g.node_id
LEFT JOIN LATERAL (
  SELECT resumed_at, to_gpu_uuid FROM rental_migrations
  WHERE from_gpu_uuid = e.gpu_uuid AND failed_at >= to_timestamp(e.at)
    AND failed_at < to_timestamp(e.at) + interval '1 day'
  ORDER BY failed_at LIMIT 1
) m ON true
WHERE e.kind = 'state_change' AND e.state = 'failed' AND e.at >= :since AND e.at < :until
ORDER BY e.at DESC, e.event_id
LIMIT :limit
""")

_REVENUE = text("""
SELECT i.period, i.currency, l.kind, sum(l.amount) AS amount, count(DISTINCT i.id) AS invoices
FROM invoices i
JOIN invoice_lines l ON l.invoice_id = i.id
WHERE i.status <> 'void' AND i.period >= :first AND i.period <= :last
GROUP BY 1, 2, 3
ORDER BY 1 DESC, 2, 3
""")


def fleet_counts(session: Session) -> list[dict[str, Any]]:
    return [dict(r._mapping) for r in session.execute(_FLEET_COUNTS)]


def failures_between(session: Session, since: int, until: int, limit: int) -> list[dict[str, Any]]:
    params = {"since": since, "until": until, "limit": limit}
    return [dict(r._mapping) for r in session.execute(_FAILURES, params)]


def revenue_by_period(session: Session, first: str, last: str) -> list[dict[str, Any]]:
    return [dict(r._mapping) for r in session.execute(_REVENUE, {"first": first, "last": last})]


def failovers_of(
    session: Session, customer_id: uuid.UUID, lo: int, hi: int, limit: int
) -> list[Failover]:
    """The customer's failovers whose failure fell in [lo, hi), oldest first (the rental
    page's failover timeline)."""
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
