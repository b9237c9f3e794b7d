from __future__ import annotations

import time
import uuid
from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Query

from app.auth.deps import Admin, ConsoleUser
from app.auth.endpoints import issued_key_read
from app.auth.schemas import IssuedKeyRead
from app.core.deps import AppSettings, DbSession
from app.core.pagination import Page, Paging, paginate
from app.fleet import repository, service, telemetry
from app.fleet.models import Pool
from app.fleet.schemas import (
    GpuClaims,
    GpuCreate,
    GpuRead,
    GpuUpdate,
    MaintenanceCreate,
    MaintenanceRead,
    NodeCreate,
    NodeRead,
    NodeRegistered,
    Settlement,
    SettlementRead,
)
from app.fleet.service import IngestGpus
from app.metering import reads, schemas

router = APIRouter(prefix="/v1", tags=["fleet"])


@router.post("/nodes", status_code=201)
def register_node(body: NodeCreate, session: DbSession, _: Admin) -> NodeRegistered:
    """Register a node; the reply carries its agent token, shown once."""
    node, token = service.register_node(session, body)
    return NodeRegistered(node=NodeRead.model_validate(node), token=issued_key_read(token))


@router.get("/nodes")
def list_nodes(session: DbSession, _: Admin, page: Paging) -> Page[NodeRead]:
    return paginate(session, repository.nodes_query(), page, NodeRead)


@router.get("/nodes/{node_id}")
def read_node(node_id: uuid.UUID, session: DbSession, _: Admin) -> NodeRead:
    return NodeRead.model_validate(service.get_node(session, node_id))


@router.post("/nodes/{node_id}/token", status_code=201)
def rotate_node_token(node_id: uuid.UUID, session: DbSession, _: Admin) -> IssuedKeyRead:
    """Issue a new agent token for the node and revoke its earlier ones."""
    return issued_key_read(service.issue_node_token(session, service.get_node(session, node_id)))


@router.get("/nodes/{node_id}/gpus")
def list_node_gpus(
    node_id: uuid.UUID, session: DbSession, admin: Admin, page: Paging
) -> Page[GpuRead]:
    service.get_node(session, node_id)
    return paginate(session, repository.gpus_query(admin, node_id=node_id), page, GpuRead)


@router.get("/gpus")
def list_gpus(
    session: DbSession,
    caller: ConsoleUser,
    page: Paging,
    node_id: uuid.UUID | None = None,
    pool: Pool | None = None,
    model: str | None = None,
) -> Page[GpuRead]:
    """Fleet-wide GPUs for admins; a customer sees the GPUs that served its rentals."""
    query = repository.gpus_query(caller, node_id=node_id, pool=pool, model=model)
    return paginate(session, query, page, GpuRead)


@router.post("/gpus", status_code=201)
def create_gpu(body: GpuCreate, session: DbSession, _: Admin) -> GpuRead:
    return GpuRead.model_validate(service.create_gpu(session, body))


@router.get("/gpus/{gpu_uuid}/claims")
def read_gpu_claims(gpu_uuid: str, session: DbSession, admin: Admin) -> GpuClaims:
    """A GPU's UUID clash: the node it is registered to and the nodes whose reports of it are
    held (records and events each) until an operator settles it."""
    return service.held_claims(session, service.get_gpu(session, gpu_uuid, admin))


@router.post("/gpus/{gpu_uuid}/settle")
def settle_gpu_clash(
    gpu_uuid: str, body: Settlement, session: DbSession, _: Admin, settings: AppSettings
) -> SettlementRead:
    """Settle a GPU's UUID clash: give it to the node it is on (its held reports are stored,
    the other claimants' refused, now and later) or retire it (``node_id`` null: every held
    report refused, and every later one). The answer says what was stored and refused, why."""
    return service.settle(session, gpu_uuid, body, IngestGpus.of(settings))


@router.get("/gpus/{gpu_uuid}")
def read_gpu(gpu_uuid: str, session: DbSession, caller: ConsoleUser) -> GpuRead:
    return GpuRead.model_validate(service.get_gpu(session, gpu_uuid, caller))


@router.patch("/gpus/{gpu_uuid}")
def update_gpu(gpu_uuid: str, body: GpuUpdate, session: DbSession, admin: Admin) -> GpuRead:
    """Move a GPU between pools (rentable, spare, maintenance)."""
    gpu = service.get_gpu(session, gpu_uuid, admin)
    return GpuRead.model_validate(service.change_pool(session, gpu, body))


# --- GPU telemetry (metering facts, clipped to what the caller may see) ---------------------

Start = Annotated[datetime, Query(description="Inclusive; ISO 8601 (UTC if no offset).")]
End = Annotated[datetime, Query(description="Exclusive; ISO 8601 (UTC if no offset).")]


@router.get("/gpus/{gpu_uuid}/timeline", tags=["metering"])
def gpu_timeline(
    gpu_uuid: str, start: Start, end: End, session: DbSession, caller: ConsoleUser
) -> schemas.Timeline:
    """State segments, unmetered gaps and health events of a GPU over [start, end)."""
    lo, hi = reads.window(start, end)
    return telemetry.timeline(session, gpu_uuid, caller, lo, hi)


@router.get("/gpus/{gpu_uuid}/metrics", tags=["metering"])
def gpu_metrics(
    gpu_uuid: str,
    start: Start,
    end: End,
    session: DbSession,
    caller: ConsoleUser,
    step: Annotated[int, Query(ge=60, le=86_400, description="Seconds per point.")] = 60,
) -> schemas.Metrics:
    """Minute metrics of a GPU over [start, end), aggregated to ``step`` seconds."""
    lo, hi = reads.window(start, end, step)
    return telemetry.metrics(session, gpu_uuid, caller, lo, hi, step)


@router.get("/fleet/health", tags=["metering"])
def fleet_health(session: DbSession, _: Admin) -> schemas.FleetHealth:
    """GPUs by last reported state and pool, and failures that began in the last 24 h."""
    return telemetry.fleet_health(session, int(time.time()))


@router.post("/gpus/{gpu_uuid}/maintenance", status_code=201)
def record_maintenance(
    gpu_uuid: str, body: MaintenanceCreate, session: DbSession, admin: Admin
) -> MaintenanceRead:
    """Record a maintenance window with explicit start and end, in the past too: rented
    seconds in it are not billed; the reply names the rentals it covers."""
    gpu = service.get_gpu(session, gpu_uuid, admin)
    window, rentals = service.record_maintenance(session, gpu, body)
    return MaintenanceRead.model_validate(window).model_copy(update={"rentals": rentals})
