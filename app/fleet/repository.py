from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import Select, exists, select
from sqlalchemy.orm import Session

from app.fleet.models import Gpu, MaintenanceWindow, Node, Pool
from app.rentals.models import GpuAssignment


def nodes_query() -> Select[Node]:
    return select(Node).order_by(Node.hostname)


def node_by_hostname(session: Session, hostname: str) -> Node | None:
    return session.scalar(select(Node).where(Node.hostname == hostname))


def gpus_query(
    *,
    customer_id: uuid.UUID | None = None,
    node_id: uuid.UUID | None = None,
    pool: Pool | None = None,
    model: str | None = None,
) -> Select[Gpu]:
    """GPUs, filtered; with customer_id, only GPUs that ever served one of its rentals."""
    query = select(Gpu).order_by(Gpu.node_id, Gpu.uuid)
    if customer_id is not None:
        query = query.where(gpu_served_customer(customer_id))
    if node_id is not None:
        query = query.where(Gpu.node_id == node_id)
    if pool is not None:
        query = query.where(Gpu.pool == pool)
    if model is not None:
        query = query.where(Gpu.model == model)
    return query


def gpu_served_customer(customer_id: uuid.UUID):
    return exists().where(
        GpuAssignment.gpu_uuid == Gpu.uuid, GpuAssignment.customer_id == customer_id
    )


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
