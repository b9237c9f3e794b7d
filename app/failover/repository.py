from __future__ import annotations

import uuid
from collections.abc import Collection
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import Select, select, text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from app.auth.service import Principal
from app.auth.tenancy import readable_by
from app.core.db import one_of
from app.core.pagination import where_given
from app.failover.models import (
    OPEN_STATES,
    Failover,
    FailoverState,
    FailoverTrigger,
    SparePolicy,
)


def readable_failovers(principal: Principal) -> Select[Failover]:
    """Every failover the principal may read (all for an admin, its own for a customer key,
    none for a node key)."""
    return select(Failover).where(readable_by(principal, Failover.customer_id))


def failovers_query(
    principal: Principal,
    *,
    rental_id: uuid.UUID | None = None,
    state: FailoverState | None = None,
) -> Select[Failover]:
    query = readable_failovers(principal).order_by(Failover.requested_at, Failover.id)
    return where_given(query, (Failover.rental_id, rental_id), (Failover.state, state))


def locked_failover(session: Session, failover_id: uuid.UUID) -> Failover | None:
    """The failover with its row locked: its transitions happen one after the other."""
    return session.scalar(select(Failover).where(Failover.id == failover_id).with_for_update())


def open_failover_of(session: Session, gpu_uuid: str) -> Failover | None:
    return session.scalar(
        select(Failover).where(
            Failover.failed_gpu_uuid == gpu_uuid, Failover.state.in_(OPEN_STATES)
        )
    )


def degraded_failover_since(session: Session, gpu_uuid: str, since: datetime) -> bool:
    """Whether the GPU had a degraded-triggered failover (in any state) opened since ``since``:
    one try per degraded run, an expired or abandoned one is not asked again."""
    query = select(Failover.id).where(
        Failover.failed_gpu_uuid == gpu_uuid,
        Failover.trigger == FailoverTrigger.DEGRADED.value,
        Failover.failed_at >= since,
    )
    return session.scalar(query.limit(1)) is not None


def requested_for_rental(session: Session, rental_id: uuid.UUID) -> Failover | None:
    return session.scalar(
        select(Failover).where(
            Failover.rental_id == rental_id, Failover.state == FailoverState.REQUESTED
        )
    )


def moving_rentals(session: Session, rental_ids: Collection[uuid.UUID]) -> set[uuid.UUID]:
    if not rental_ids:
        return set()
    query = select(Failover.rental_id).where(
        one_of(Failover.rental_id, rental_ids), Failover.state == FailoverState.REQUESTED
    )
    return set(session.scalars(query))


def reservations(session: Session, gpu_uuids: Collection[str]) -> dict[str, Failover]:
    """The requested failover holding each of these GPUs as its spare, if any."""
    rows = session.scalars(
        select(Failover).where(
            Failover.state == FailoverState.REQUESTED, one_of(Failover.spare_gpu_uuid, gpu_uuids)
        )
    )
    return {f.spare_gpu_uuid: f for f in rows if f.spare_gpu_uuid is not None}


def policy(session: Session, datacenter: str, model: str) -> SparePolicy | None:
    return session.get(SparePolicy, (datacenter, model))


def locked_policy(
    session: Session, datacenter: str, model: str, default_percent: Decimal
) -> SparePolicy:
    """The site's policy row (created with the defaults if missing), locked: evaluations of
    one pool's crossing happen one after the other."""
    session.execute(
        insert(SparePolicy)
        .values(datacenter=datacenter, model=model, target_percent=default_percent, min_count=0)
        .on_conflict_do_nothing()
    )
    return session.execute(
        select(SparePolicy)
        .where(SparePolicy.datacenter == datacenter, SparePolicy.model == model)
        .with_for_update()
        .execution_options(populate_existing=True)
    ).scalar_one()


def upsert_policy(session: Session, values: dict[str, Any]) -> SparePolicy:
    statement = insert(SparePolicy).values(**values)
    session.execute(
        statement.on_conflict_do_update(
            index_elements=["datacenter", "model"],
            set_={
                "target_percent": statement.excluded.target_percent,
                "min_count": statement.excluded.min_count,
            },
        )
    )
    row = session.get(SparePolicy, (values["datacenter"], values["model"]), populate_existing=True)
    assert row is not None  # just written
    return row


def policies_query() -> Select[SparePolicy]:
    return select(SparePolicy).order_by(SparePolicy.datacenter, SparePolicy.model)


_SUMMARY = text("""
WITH f AS (
    SELECT datacenter, model, trigger,
           extract(epoch FROM detected_at - failed_at) AS detection,
           extract(epoch FROM requested_at - failed_at) AS request,
           extract(epoch FROM resumed_at - failed_at) AS resume
    FROM failovers
)
SELECT datacenter, model, trigger, count(*),
       count(detection),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY detection),
       percentile_cont(0.99) WITHIN GROUP (ORDER BY detection),
       count(request),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY request),
       percentile_cont(0.99) WITHIN GROUP (ORDER BY request),
       count(resume),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY resume),
       percentile_cont(0.99) WITHIN GROUP (ORDER BY resume)
FROM f GROUP BY datacenter, model, trigger ORDER BY datacenter, model, trigger
""")


def latency_rows(session: Session) -> list[tuple[Any, ...]]:
    """Per (datacenter, model, trigger): failovers, then (count, p50, p99) of detection, request and
    resume seconds, from the stored failovers."""
    return [tuple(row) for row in session.execute(_SUMMARY)]
