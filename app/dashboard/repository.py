"""The dashboard's own read: recent health events on the customer's GPUs while it rented them.

An assignment's end second is included: a migration ends the failed GPU's assignment at
``failed_at``, the very second of the failure event that caused it.
"""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

_EVENTS_DURING_ASSIGNMENTS = text("""
SELECT e.event_id, e.gpu_uuid, e.at, e.kind, e.code, e.state, e.rule, e.detail, a.rental_id,
  extract(epoch FROM e.received_at)::bigint AS received_s
FROM gpu_assignments a
JOIN health_events e ON e.gpu_uuid = a.gpu_uuid
  AND e.at >= GREATEST(extract(epoch FROM a.start_at)::bigint, :lo) AND e.at < :hi
  AND (a.end_at IS NULL OR e.at <= extract(epoch FROM a.end_at)::bigint)
WHERE a.customer_id = :customer
  AND (NOT :failures OR (e.kind = 'state_change' AND e.state = 'failed'))
  AND a.start_at < to_timestamp(:hi) AND (a.end_at IS NULL OR a.end_at > to_timestamp(:lo))
ORDER BY e.at DESC, e.event_id
LIMIT :limit
""")


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
    params = {
        "customer": customer_id,
        "lo": lo,
        "hi": hi,
        "limit": limit,
        "failures": failures_only,
    }
    return [dict(row._mapping) for row in session.execute(_EVENTS_DURING_ASSIGNMENTS, params)]
