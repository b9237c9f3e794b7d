from __future__ import annotations

import uuid
from datetime import UTC, datetime

from sqlalchemy.orm import Session

from app.auth import service as key_service
from app.auth.models import ApiKey, KeyKind
from app.auth.service import IssuedKey, Principal
from app.core.errors import Conflict, not_found
from app.fleet import repository
from app.fleet.models import Gpu, MaintenanceWindow, Node, Pool
from app.fleet.schemas import GpuCreate, GpuUpdate, NodeCreate


def get_node(session: Session, node_id: uuid.UUID) -> Node:
    node = session.get(Node, node_id)
    if node is None:
        raise not_found("node", node_id)
    return node


def register_node(session: Session, data: NodeCreate) -> tuple[Node, IssuedKey]:
    if repository.node_by_hostname(session, data.hostname) is not None:
        raise Conflict(
            f"a node with hostname {data.hostname!r} is already registered", ("body", "hostname")
        )
    node = Node(**data.model_dump())
    session.add(node)
    session.flush()
    return node, issue_node_token(session, node)


def enroll_node(session: Session, data: NodeCreate) -> tuple[Node, IssuedKey]:
    """Register the node, or, registered before (a restarted deployment), rotate its token."""
    node = repository.node_by_hostname(session, data.hostname)
    if node is None:
        return register_node(session, data)
    return node, issue_node_token(session, node)


def issue_node_token(session: Session, node: Node) -> IssuedKey:
    """A new agent token for the node; earlier tokens stop working (rotation)."""
    key_service.revoke_node_keys(session, node.id)
    # A label only: a 253-character hostname must not overflow the key name's column.
    name = f"agent@{node.hostname}"[: ApiKey.name.type.length]
    return key_service.issue_key(session, KeyKind.NODE, name, node_id=node.id)


def get_gpu(session: Session, gpu_uuid: str, principal: Principal) -> Gpu:
    """The GPU, if the caller may see it (customers: GPUs that served their rentals)."""
    gpu = session.get(Gpu, gpu_uuid)
    scope = principal.customer_scope
    if gpu is None or (scope is not None and not _served(session, gpu_uuid, scope)):
        raise not_found("GPU", gpu_uuid, ("path", "gpu_uuid"))
    return gpu


def _served(session: Session, gpu_uuid: str, customer_id: uuid.UUID) -> bool:
    query = repository.gpus_query(customer_id=customer_id).where(Gpu.uuid == gpu_uuid)
    return session.scalar(query) is not None


def create_gpu(session: Session, data: GpuCreate) -> Gpu:
    get_node(session, data.node_id)
    if session.get(Gpu, data.uuid) is not None:
        raise Conflict(f"GPU {data.uuid} is already registered", ("body", "uuid"))
    gpu = Gpu(**data.model_dump())
    session.add(gpu)
    if gpu.pool == Pool.MAINTENANCE:
        session.add(MaintenanceWindow(gpu_uuid=gpu.uuid, start_at=datetime.now(UTC)))
    session.flush()
    return gpu


def change_pool(session: Session, gpu: Gpu, data: GpuUpdate) -> Gpu:
    """Move a GPU between pools; entering or leaving maintenance opens or closes its window."""
    now = datetime.now(UTC)
    if data.pool == Pool.MAINTENANCE and gpu.pool != Pool.MAINTENANCE:
        session.add(MaintenanceWindow(gpu_uuid=gpu.uuid, start_at=now, reason=data.reason))
    elif data.pool != Pool.MAINTENANCE and gpu.pool == Pool.MAINTENANCE:
        window = repository.open_maintenance_window(session, gpu.uuid)
        if window is not None:
            window.end_at = now
    gpu.pool = data.pool
    session.flush()
    return gpu
