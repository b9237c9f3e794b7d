"""A GPU's telemetry as the console API serves it: timeline, metrics and fleet health.

Customers see only GPUs that served their rentals, and only the seconds of those rentals:
everything is clipped to the customer's assignment intervals of that GPU (the visibility rule
of ``app.rentals.reads``). The telemetry itself comes from metering's read interface.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping

from sqlalchemy.orm import Session

from app.auth.service import Principal
from app.core.epoch import epoch, from_epoch
from app.core.errors import not_found
from app.fleet import repository
from app.fleet.models import Gpu
from app.metering import reads, schemas
from app.rentals.reads import served

FAILED_LOOKBACK_S = 86_400
_OPEN_END = 2**62  # an assignment still running: visible to the end of any window


def visible(
    session: Session, gpu_uuid: str, caller: Principal, start: int, end: int
) -> list[tuple[int, int]]:
    """The parts of [start, end) the caller may see of this GPU; 404 when none ever."""
    if session.get(Gpu, gpu_uuid) is None:
        raise not_found("GPU", gpu_uuid, ("path", "gpu_uuid"))
    if caller.customer_scope is None:
        return [(start, end)]
    rented = _rented(session, caller.customer_scope, [gpu_uuid])[gpu_uuid]
    if not rented:
        raise not_found("GPU", gpu_uuid, ("path", "gpu_uuid"))
    return _clip([(start, end)], rented)


def _rented(
    session: Session, customer_id: uuid.UUID, gpu_uuids: list[str]
) -> dict[str, list[tuple[int, int]]]:
    """Each GPU's intervals serving this customer's rentals, in start order."""
    query = served(customer_id=customer_id, gpu_uuids=gpu_uuids)
    rented: dict[str, list[tuple[int, int]]] = {gpu: [] for gpu in gpu_uuids}
    for a in session.execute(query.order_by("start_at")):
        end = _OPEN_END if a.end_at is None else epoch(a.end_at)
        rented[a.gpu_uuid].append((epoch(a.start_at), end))
    return rented


def _clip(parts: list[tuple[int, int]], rented: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The non-empty overlaps of ``parts`` with ``rented``."""
    overlaps = [(max(lo, a), min(hi, b)) for lo, hi in parts for a, b in rented]
    return [(a, b) for a, b in overlaps if a < b]


def timeline(
    session: Session, gpu_uuid: str, caller: Principal, start: int, end: int
) -> schemas.Timeline:
    parts = visible(session, gpu_uuid, caller, start, end)
    return reads.timeline(session, gpu_uuid, parts, start, end)


def timelines(
    session: Session,
    caller: Principal,
    parts_by_gpu: Mapping[str, list[tuple[int, int]]],
    start: int,
    end: int,
) -> dict[str, schemas.Timeline]:
    """Many GPUs' timelines in one read, each part clipped to what the caller may see (the
    rental page: one call for all of a rental's assignments)."""
    if caller.customer_scope is not None:
        rented = _rented(session, caller.customer_scope, list(parts_by_gpu))
        parts_by_gpu = {gpu: _clip(parts, rented[gpu]) for gpu, parts in parts_by_gpu.items()}
    return reads.timelines(session, parts_by_gpu, start, end)


def metrics(
    session: Session, gpu_uuid: str, caller: Principal, start: int, end: int, step: int
) -> schemas.Metrics:
    parts = visible(session, gpu_uuid, caller, start, end)
    return reads.metrics(session, gpu_uuid, parts, step)


def fleet_health(session: Session, now: int) -> schemas.FleetHealth:
    counts = [
        schemas.StateCount(state=state or "unknown", pool=pool, gpus=n)
        for state, pool, n in repository.gpu_counts(session)
    ]
    failures = reads.failed_since(session, now - FAILED_LOOKBACK_S)
    gpus = {g.uuid: g for g in repository.gpus_by_uuid(session, {f["gpu_uuid"] for f in failures})}
    failed = [
        schemas.FailedGpu(
            gpu_uuid=row["gpu_uuid"],
            node_id=gpus[row["gpu_uuid"]].node_id,
            model=gpus[row["gpu_uuid"]].model,
            since=from_epoch(row["start"]),
            until=from_epoch(row["end"]),
            evidence=row["evidence"],
        )
        for row in failures
    ]
    return schemas.FleetHealth(at=from_epoch(now), by_state_and_pool=counts, recently_failed=failed)
