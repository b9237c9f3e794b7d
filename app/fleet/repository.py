from __future__ import annotations

import uuid
from collections.abc import Collection, Iterable
from datetime import datetime

from psycopg.errors import LockNotAvailable
from sqlalchemy import (
    Exists,
    Select,
    delete,
    select,
    text,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from app.auth.service import Principal
from app.core.db import one_of, pipelined
from app.core.pagination import where_given
from app.fleet.models import Gpu, MaintenanceWindow, Node, Pool, RefusedClaim
from app.metering.ports import LatestReport
from app.rentals.reads import ever_served


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
    return where_given(query, (Gpu.node_id, node_id), (Gpu.pool, pool), (Gpu.model, model))


def gpu_served_customer(customer_id: uuid.UUID) -> Exists:
    """Whether the GPU of the enclosing query ever served one of the customer's rentals."""
    return ever_served(customer_id, Gpu.uuid)


def gpus_of_nodes(session: Session, hostnames: Collection[str] | None) -> dict[str, list[Gpu]]:
    """The nodes of these hostnames (None: every node) that exist, each with its GPUs (none
    reported: empty)."""
    query = select(Node.hostname, Gpu).outerjoin(Gpu, Gpu.node_id == Node.id)
    if hostnames is not None:
        query = query.where(Node.hostname.in_(hostnames))
    rows = session.execute(query.order_by(Node.hostname, Gpu.uuid))
    found: dict[str, list[Gpu]] = {}
    for hostname, gpu in rows:
        found.setdefault(hostname, [])
        if gpu is not None:
            found[hostname].append(gpu)
    return found


def gpus_by_uuid(session: Session, gpu_uuids: Collection[str]) -> list[Gpu]:
    return list(session.scalars(select(Gpu).where(Gpu.uuid.in_(gpu_uuids))))


def open_maintenance_window(session: Session, gpu_uuid: str) -> MaintenanceWindow | None:
    return session.scalar(
        select(MaintenanceWindow).where(
            MaintenanceWindow.gpu_uuid == gpu_uuid, MaintenanceWindow.end_at.is_(None)
        )
    )


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


def gpus_of_pool_site(
    session: Session, model: str, datacenter: str
) -> list[tuple[str, str, str | None, uuid.UUID, str | None]]:
    """(GPU, pool, last state, node, node's topology group) of every GPU of ``model`` in
    ``datacenter``, by GPU (the spare pool's raw material)."""
    rows = session.execute(
        text("""
        SELECT g.uuid, g.pool::text, g.last_state, n.id, n.topology_group
        FROM gpus g JOIN nodes n ON n.id = g.node_id
        WHERE g.model = :model AND n.datacenter = :dc
        ORDER BY g.uuid
        """),
        {"model": model, "dc": datacenter},
    )
    return [(gpu, pool, state, node, group) for gpu, pool, state, node, group in rows]


def pool_sites(session: Session) -> list[tuple[str, str]]:
    rows = session.execute(
        text("""
        SELECT DISTINCT n.datacenter, g.model FROM gpus g JOIN nodes n ON n.id = g.node_id
        ORDER BY 1, 2
        """)
    )
    return [(dc, model) for dc, model in rows]


def lock_gpu_within(session: Session, gpu_uuid: str, timeout_ms: int) -> bool:
    """Lock the GPU's row, waiting at most ``timeout_ms``; False when it stayed locked (the
    caller tries another GPU). Bounded, so two transactions that each hold GPU rows and want
    the other's never deadlock: one gives up instead."""
    previous = session.scalar(text("SELECT current_setting('lock_timeout')"))
    try:
        with session.begin_nested():
            session.execute(
                text("SELECT set_config('lock_timeout', :t, true)"), {"t": f"{timeout_ms}ms"}
            )
            session.execute(text("SELECT 1 FROM gpus WHERE uuid = :u FOR UPDATE"), {"u": gpu_uuid})
    except OperationalError as error:
        if not isinstance(error.orig, LockNotAvailable):
            raise
        return False
    finally:
        session.execute(text("SELECT set_config('lock_timeout', :t, true)"), {"t": previous})
    return True


# --- written by ingest (through metering.ports.GpuRegistry) and read for fleet health ----


# A GPU in dispute or retired has no node whose reports are simply stored: NULL.
_GPU_OWNERS = text("""
SELECT uuid, CASE WHEN disputed_at IS NULL AND retired_at IS NULL THEN node_id END
FROM gpus WHERE uuid = ANY(CAST(:u AS text[]))
""")


def gpu_owners(session: Session, gpu_uuids: Iterable[str]) -> dict[str, uuid.UUID | None]:
    # Ingest's statements go through ``pipelined``: binary arrays (see there).
    [rows] = pipelined(session, [(_GPU_OWNERS, {"u": list(gpu_uuids)})])
    return {gpu: node for gpu, node in rows}


def lock_gpus(session: Session, gpu_uuids: Collection[str]) -> list[Gpu]:
    """The GPUs, locked in UUID order (two nodes' batches never wait on each other in turn)."""
    query = select(Gpu).where(one_of(Gpu.uuid, gpu_uuids)).order_by(Gpu.uuid)
    return list(session.scalars(query.with_for_update().execution_options(populate_existing=True)))


def refused_claims(
    session: Session, node_id: uuid.UUID, gpu_uuids: Collection[str]
) -> dict[str, str]:
    """The GPUs among these whose clash was settled against the node, and why."""
    rows = session.execute(
        select(RefusedClaim.gpu_uuid, RefusedClaim.reason).where(
            RefusedClaim.node_id == node_id, RefusedClaim.gpu_uuid.in_(list(gpu_uuids))
        )
    )
    return {gpu: reason for gpu, reason in rows}


def refuse_claims(
    session: Session, gpu_uuid: str, node_ids: Collection[uuid.UUID], reason: str
) -> None:
    """Settle the GPU's clash against these nodes: their reports of it are refused."""
    statement = pg_insert(RefusedClaim).values(
        [{"gpu_uuid": gpu_uuid, "node_id": node, "reason": reason} for node in node_ids]
    )
    session.execute(
        statement.on_conflict_do_update(
            index_elements=["gpu_uuid", "node_id"], set_={"reason": statement.excluded.reason}
        )
    )


def accept_claim(session: Session, gpu_uuid: str, node_id: uuid.UUID) -> None:
    """The node's reports of the GPU are its owner's again (a clash settled its way)."""
    session.execute(
        delete(RefusedClaim).where(
            RefusedClaim.gpu_uuid == gpu_uuid, RefusedClaim.node_id == node_id
        )
    )


def register_gpus(session: Session, node_id: uuid.UUID, models: dict[str, str], pool: Pool) -> None:
    """Register GPUs to the node in ``pool``; ones registered meanwhile are left as is."""
    session.execute(
        text("""
        INSERT INTO gpus (uuid, node_id, model, pool)
        SELECT u, :node, m, CAST(:pool AS gpu_pool)
        FROM unnest(CAST(:u AS text[]), CAST(:m AS text[])) AS t(u, m)
        ON CONFLICT (uuid) DO NOTHING
        """),
        {"node": node_id, "u": list(models), "m": list(models.values()), "pool": pool.value},
    )


def gpu_count_of_node(session: Session, node_id: uuid.UUID) -> int:
    count = session.scalar(text("SELECT count(*) FROM gpus WHERE node_id = :n"), {"n": node_id})
    return int(count or 0)


_TOUCH_GPUS = text("""
UPDATE gpus g SET last_state = t.state, last_seen_at = to_timestamp(t.seen),
    model = CASE WHEN g.model = 'unknown' THEN t.model ELSE g.model END,
    device_index = COALESCE(t.device_index, g.device_index),
    minor_number = COALESCE(t.minor_number, g.minor_number)
FROM unnest(CAST(:u AS text[]), CAST(:m AS text[]), CAST(:s AS text[]),
            CAST(:t AS bigint[]), CAST(:i AS integer[]), CAST(:n AS integer[]))
         AS t(uuid, model, state, seen, device_index, minor_number),
     gpus before
WHERE g.uuid = t.uuid AND before.uuid = g.uuid
  AND (g.last_seen_at IS NULL OR g.last_seen_at <= to_timestamp(t.seen))
RETURNING g.uuid, before.last_state, g.last_state, t.seen
""")


def touch_gpus(
    session: Session, latest: dict[str, LatestReport]
) -> list[tuple[str, str | None, str, int]]:
    """Record each GPU's latest state, time, device index and minor number (model fills one
    registered from events only). Returns (gpu, state before, state now, seen) for each GPU
    whose state changed."""
    gpus = list(latest)
    params = {
        "u": gpus,
        "m": [latest[g][0] for g in gpus],
        "s": [latest[g][1] for g in gpus],
        "t": [latest[g][2] for g in gpus],
        "i": [latest[g][3] for g in gpus],
        "n": [latest[g][4] for g in gpus],
    }
    [rows] = pipelined(session, [(_TOUCH_GPUS, params)])
    return [(gpu, before, now, seen) for gpu, before, now, seen in rows if before != now]


def gpu_counts(session: Session) -> list[tuple[str | None, str, int]]:
    """(last state, pool, GPUs) for the whole fleet."""
    rows = session.execute(
        text("SELECT last_state, pool::text, count(*) FROM gpus GROUP BY 1, 2 ORDER BY 1, 2")
    )
    return [(state, pool, n) for state, pool, n in rows]


def gpus_in_state(session: Session, state: str, seen_since: datetime, limit: int) -> list[str]:
    """Up to ``limit`` GPUs whose latest report, at or after ``seen_since``, is ``state``
    (by UUID: a run covers the same GPUs each time)."""
    query = (
        select(Gpu.uuid)
        .where(Gpu.last_state == state, Gpu.last_seen_at >= seen_since)
        .order_by(Gpu.uuid)
        .limit(limit)
    )
    return list(session.scalars(query))
