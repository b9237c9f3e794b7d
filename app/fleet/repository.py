from __future__ import annotations

import uuid
from collections.abc import Collection, Iterable
from datetime import datetime

from sqlalchemy import Exists, Select, select, text
from sqlalchemy.orm import Session

from app.auth.service import Principal
from app.fleet.models import Gpu, MaintenanceWindow, Node, Pool
from app.rentals.models import GpuAssignment
from app.rentals.visibility import served


def nodes_query() -> Select[Node]:
    return select(Node).order_by(Node.hostname)


def node_by_hostname(session: Session, hostname: str) -> Node | None:
    return session.scalar(select(Node).where(Node.hostname == hostname))


def readable_gpus(principal: Principal) -> Select[Gpu]:
    """Every GPU the principal may read: all for an admin, for a customer key the GPUs that
    ever served one of its rentals; every list and get of GPUs starts here."""
    scope = principal.customer_scope
    query = select(Gpu)
    return query if scope is None else query.where(gpu_served_customer(scope))


def gpus_query(
    principal: Principal,
    *,
    node_id: uuid.UUID | None = None,
    pool: Pool | None = None,
    model: str | None = None,
) -> Select[Gpu]:
    """The principal's GPUs, filtered."""
    query = readable_gpus(principal).order_by(Gpu.node_id, Gpu.uuid)
    if node_id is not None:
        query = query.where(Gpu.node_id == node_id)
    if pool is not None:
        query = query.where(Gpu.pool == pool)
    if model is not None:
        query = query.where(Gpu.model == model)
    return query


def gpu_served_customer(customer_id: uuid.UUID) -> Exists:
    """Whether the GPU of the enclosing query ever served one of the customer's rentals."""
    return served(customer_id=customer_id).where(GpuAssignment.gpu_uuid == Gpu.uuid).exists()


def gpus_by_uuid(session: Session, gpu_uuids: Collection[str]) -> list[Gpu]:
    return list(session.scalars(select(Gpu).where(Gpu.uuid.in_(gpu_uuids))))


def open_maintenance_window(session: Session, gpu_uuid: str) -> MaintenanceWindow | None:
    return session.scalar(
        select(MaintenanceWindow).where(
            MaintenanceWindow.gpu_uuid == gpu_uuid, MaintenanceWindow.end_at.is_(None)
        )
    )


def rentals_assigned(
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


def maintenance_windows(
    session: Session, gpu_uuids: list[str], start: datetime, end: datetime
) -> list[MaintenanceWindow]:
    return list(
        session.scalars(
            select(MaintenanceWindow).where(
                MaintenanceWindow.gpu_uuid.in_(gpu_uuids),
                MaintenanceWindow.start_at < end,
                (MaintenanceWindow.end_at.is_(None)) | (MaintenanceWindow.end_at > start),
            )
        )
    )


# --- written by ingest (through metering.ports.GpuRegistry) and read for fleet health ----


def gpu_owners(session: Session, gpu_uuids: Iterable[str]) -> dict[str, uuid.UUID]:
    rows = session.execute(
        text("SELECT uuid, node_id FROM gpus WHERE uuid = ANY(CAST(:u AS text[]))"),
        {"u": list(gpu_uuids)},
    )
    return {gpu: node for gpu, node in rows}


def register_gpus(session: Session, node_id: uuid.UUID, models: dict[str, str]) -> None:
    """Register GPUs to the node (pool ``rentable``); ones registered meanwhile are left as is."""
    session.execute(
        text("""
        INSERT INTO gpus (uuid, node_id, model, pool)
        SELECT u, :node, m, 'rentable'
        FROM unnest(CAST(:u AS text[]), CAST(:m AS text[])) AS t(u, m)
        ON CONFLICT (uuid) DO NOTHING
        """),
        {"node": node_id, "u": list(models), "m": list(models.values())},
    )


def touch_gpus(
    session: Session, latest: dict[str, tuple[str, str, int]]
) -> list[tuple[str, str | None, str, int]]:
    """Record each GPU's latest state and time (model fills one registered from events only).
    Returns (gpu, state before, state now, seen) for each GPU whose state changed."""
    gpus = list(latest)
    rows = session.execute(
        text("""
        UPDATE gpus g SET last_state = t.state, last_seen_at = to_timestamp(t.seen),
            model = CASE WHEN g.model = 'unknown' THEN t.model ELSE g.model END
        FROM unnest(CAST(:u AS text[]), CAST(:m AS text[]), CAST(:s AS text[]),
                    CAST(:t AS bigint[])) AS t(uuid, model, state, seen),
             gpus before
        WHERE g.uuid = t.uuid AND before.uuid = g.uuid
          AND (g.last_seen_at IS NULL OR g.last_seen_at <= to_timestamp(t.seen))
        RETURNING g.uuid, before.last_state, g.last_state, t.seen
        """),
        {
            "u": gpus,
            "m": [latest[g][0] for g in gpus],
            "s": [latest[g][1] for g in gpus],
            "t": [latest[g][2] for g in gpus],
        },
    )
    return [(gpu, before, now, seen) for gpu, before, now, seen in rows if before != now]


def gpu_counts(session: Session) -> list[tuple[str | None, str, int]]:
    """(last state, pool, GPUs) for the whole fleet."""
    rows = session.execute(
        text("SELECT last_state, pool::text, count(*) FROM gpus GROUP BY 1, 2 ORDER BY 1, 2")
    )
    return [(state, pool, n) for state, pool, n in rows]
