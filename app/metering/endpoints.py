from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request

from app.auth.deps import NodeAgent
from app.core.deps import DbSession
from app.metering import service
from app.metering.ports import GpuRegistry
from app.settings import get_settings
from metering_agent.protocol import INGEST_PATH, IngestBatch, IngestResult

router = APIRouter(tags=["metering"])

_ERRORS: dict[int | str, dict[str, Any]] = {
    403: {"description": "a record or event names a GPU registered to another node"},
    409: {"description": "records contradict stored seconds; each conflict is listed"},
    413: {"description": "more records plus events than the batch limit"},
    422: {"description": "invalid items, each listed by index and field"},
}


def gpu_registry(request: Request) -> GpuRegistry:
    """The fleet's GPUs, as the composition root (``app.main.create_app``) wired them."""
    registry: GpuRegistry = request.app.state.gpu_registry
    return registry


@router.post(INGEST_PATH, responses=_ERRORS)
def ingest(
    batch: IngestBatch,
    session: DbSession,
    node: NodeAgent,
    gpus: Annotated[GpuRegistry, Depends(gpu_registry)],
) -> IngestResult:
    """Store a node agent's batch of usage records and health events, whole or not at all.

    Re-sent records and events are counted as duplicates and change nothing.
    """
    assert node.node_id is not None  # node keys always carry their node
    return service.ingest(session, node.node_id, batch, get_settings(), gpus)
