from __future__ import annotations

import time
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query

from app.auth.deps import Admin, ConsoleUser, NodeAgent
from app.core.deps import DbSession
from app.metering import reads, schemas, service
from app.settings import get_settings
from metering_agent.protocol import INGEST_PATH, IngestBatch, IngestResult

router = APIRouter(tags=["metering"])

_ERRORS: dict[int | str, dict[str, Any]] = {
    403: {"description": "a record or event names a GPU registered to another node"},
    409: {"description": "records contradict stored seconds; each conflict is listed"},
    413: {"description": "more records plus events than the batch limit"},
    422: {"description": "invalid items, each listed by index and field"},
}


@router.post(INGEST_PATH, responses=_ERRORS)
def ingest(batch: IngestBatch, session: DbSession, node: NodeAgent) -> IngestResult:
    """Store a node agent's batch of usage records and health events, whole or not at all.

    Re-sent records and events are counted as duplicates and change nothing.
    """
    assert node.node_id is not None  # node keys always carry their node
    return service.ingest(session, node.node_id, batch, get_settings())


Start = Annotated[datetime, Query(description="Inclusive; ISO 8601 (UTC if no offset).")]
End = Annotated[datetime, Query(description="Exclusive; ISO 8601 (UTC if no offset).")]


@router.get("/v1/gpus/{gpu_uuid}/timeline")
def gpu_timeline(
    gpu_uuid: str, start: Start, end: End, session: DbSession, caller: ConsoleUser
) -> schemas.Timeline:
    """State segments, unmetered gaps and health events of a GPU over [start, end)."""
    lo, hi = reads.window(start, end)
    return reads.timeline(session, gpu_uuid, caller, lo, hi)


@router.get("/v1/gpus/{gpu_uuid}/metrics")
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
    return reads.metrics(session, gpu_uuid, caller, lo, hi, step)


@router.get("/v1/fleet/health")
def fleet_health(session: DbSession, _: Admin) -> schemas.FleetHealth:
    """GPUs by last reported state and pool, and failures that began in the last 24 h."""
    return reads.fleet_health(session, int(time.time()))
