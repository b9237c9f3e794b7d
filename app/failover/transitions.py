"""A failover's transitions that close it, and its events (the Failover API contract)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from sqlalchemy.orm import Session

from app.events.service import publish
from app.failover import repository
from app.failover.models import Failover, FailoverState
from app.failover.pool import check_pool
from app.rentals import service as rentals


def expire(
    session: Session, failover_id: uuid.UUID, now: datetime, default_target: Decimal
) -> Failover | None:
    """Release the spare of a reservation not confirmed by its deadline (the expiry job);
    anything else (resumed, abandoned, not yet due) is left as it is. ``default_target``: the
    spare target of a pool with no policy (``pool.check_pool``)."""
    failover = repository.locked_failover(session, failover_id)
    if (
        failover is None
        or failover.state != FailoverState.REQUESTED
        or failover.reserved_until is None
        or failover.reserved_until > now
    ):
        return None
    reason = f"not confirmed by {failover.reserved_until.isoformat()}"
    close(session, failover, FailoverState.EXPIRED, reason)
    publish_failover(session, "failover.expired", failover)
    check_pool(session, failover.datacenter, failover.model, default_target)
    return failover


def close(session: Session, failover: Failover, state: FailoverState, reason: str | None) -> None:
    failover.state = state
    failover.closed_at = datetime.now(UTC)
    if reason is not None:
        failover.reason = reason
    session.flush()


def publish_failover(session: Session, event_type: str, failover: Failover) -> None:
    publish(
        session,
        event_type,
        event_data(failover, preempted_rental_seen_by(session, failover, failover.customer_id)),
        subject=f"failover/{failover.id}",
        customer_id=failover.customer_id,
    )


def preempted_rental_seen_by(
    session: Session, failover: Failover, customer_id: uuid.UUID | None
) -> uuid.UUID | None:
    """The rental the failover preempted, as a reader may see it: an admin (``customer_id``
    None) or the customer that rented it; to anyone else (the failover's own customer, when
    the spare was another tenant's preemptible rental) None: no tenant learns another's ids."""
    rental_id = failover.preempted_rental_id
    if rental_id is None or customer_id is None:
        return rental_id
    owner = rentals.rental_by_id(session, rental_id).customer_id
    return rental_id if owner == customer_id else None


def event_data(failover: Failover, preempted_rental_id: uuid.UUID | None) -> dict[str, Any]:
    """The Failover API contract's event payload (the same for every failover event);
    ``preempted_rental_id`` as its reader may see it (``preempted_rental_seen_by``)."""
    return {
        "failover_id": failover.id,
        "rental_id": failover.rental_id,
        "customer_id": failover.customer_id,
        "failed_gpu_uuid": failover.failed_gpu_uuid,
        "spare_gpu_uuid": failover.spare_gpu_uuid,
        "datacenter": failover.datacenter,
        "model": failover.model,
        "topology_group": failover.topology_group,
        "state": failover.state.value,
        "failed_at": failover.failed_at.isoformat(),
        "detected_at": failover.detected_at.isoformat(),
        "requested_at": failover.requested_at.isoformat(),
        "reserved_until": iso(failover.reserved_until),
        "resumed_at": iso(failover.resumed_at),
        "migration_id": failover.migration_id,
        "spare_preempted": failover.preempted_rental_id is not None,
        "preempted_rental_id": preempted_rental_id,
        "trigger": failover.trigger,
        "degraded_causes": failover.degraded_causes,
        "credited_as": (
            "failure"
            if failover.state == FailoverState.NO_SPARE and not failover.degraded_causes
            else None
        ),
        "reason": failover.reason,
        "evidence": failover.evidence,
    }


def iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()
