from __future__ import annotations

import uuid
from datetime import UTC, datetime

from fastapi import APIRouter
from sqlalchemy.orm import Session

from app.auth.deps import Admin, ConsoleUser
from app.auth.service import Principal
from app.core.deps import AppSettings, DbSession
from app.core.pagination import Page, Paging, paginate
from app.core.schemas import Instant
from app.failover import repository, service
from app.failover.models import Failover, FailoverState
from app.failover.schemas import (
    AbandonedBody,
    FailoverRead,
    FailoverSummary,
    ResumedBody,
    SparePolicyRead,
    SparePolicyWrite,
    SparePoolView,
)
from app.failover.service import FailoverSettings
from app.failover.transitions import preempted_rental_seen_by

router = APIRouter(prefix="/v1/failovers", tags=["failovers"])
spares = APIRouter(tags=["failovers"])


@router.get("")
def list_failovers(
    session: DbSession,
    caller: ConsoleUser,
    page: Paging,
    rental_id: uuid.UUID | None = None,
    state: FailoverState | None = None,
) -> Page[FailoverRead]:
    """Failovers, oldest request first; customers see their own rentals' only."""
    query = repository.failovers_query(caller, rental_id=rental_id, state=state)
    return paginate(session, query, page, FailoverRead, lambda f: _read(session, f, caller))


@router.get("/summary")
def failover_summary(session: DbSession, _: Admin) -> FailoverSummary:
    """Latency p50/p99 per datacenter and model, from the stored failovers: detection (first
    failed second -> the service knows), request (-> failover requested), resume."""
    return service.summary(session)


@router.get("/{failover_id}")
def read_failover(failover_id: uuid.UUID, session: DbSession, caller: ConsoleUser) -> FailoverRead:
    return _read(session, service.get_failover(session, failover_id, caller), caller)


def _read(session: Session, failover: Failover, caller: Principal) -> FailoverRead:
    return FailoverRead.of(
        failover, preempted_rental_seen_by(session, failover, caller.customer_id)
    )


@router.post("/{failover_id}/resumed")
def resumed(
    failover_id: uuid.UUID,
    session: DbSession,
    _: Admin,
    settings: AppSettings,
    body: ResumedBody | None = None,
) -> FailoverRead:
    """The job runs on the reserved spare since ``resumed_at`` (default now): the migration is
    recorded and the rental moves to the spare. Calling it again returns the same failover."""
    at = body.resumed_at if body is not None else None
    failover = service.resume(session, failover_id, at, FailoverSettings.of(settings))
    return FailoverRead.of(failover, failover.preempted_rental_id)  # an admin sees it


@router.post("/{failover_id}/abandoned")
def abandoned(
    failover_id: uuid.UUID, body: AbandonedBody, session: DbSession, _: Admin, settings: AppSettings
) -> FailoverRead:
    """The orchestrator will not move the job: the spare is released."""
    failover = service.abandon(session, failover_id, body.reason, settings.spare_target_percent)
    return FailoverRead.of(failover, failover.preempted_rental_id)  # an admin sees it


@spares.get("/v1/spare-pool")
def spare_pool(
    session: DbSession,
    _: Admin,
    settings: AppSettings,
    start: Instant | None = None,
    end: Instant | None = None,
) -> SparePoolView:
    """Each datacenter and model's hot spares now (available, reserved, preemptibly rented,
    target) and the spare GPU-hours sold preemptibly in [start, end) (default: this UTC
    month to now)."""
    now = datetime.now(UTC)
    first = start or now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    pools = service.pool_view(session, first, end or now, settings.spare_target_percent)
    return SparePoolView(pools=pools)


@spares.get("/v1/spare-policies")
def list_spare_policies(session: DbSession, _: Admin, page: Paging) -> Page[SparePolicyRead]:
    """Policies set or evaluated so far (a site without one keeps the default share)."""
    return paginate(session, repository.policies_query(), page, SparePolicyRead)


@spares.put("/v1/spare-policies")
def set_spare_policy(
    body: SparePolicyWrite, session: DbSession, _: Admin, settings: AppSettings
) -> SparePolicyRead:
    """How many hot spares a model keeps in a datacenter: the larger of ``min_count`` and
    ``target_percent`` of its GPUs."""
    policy = service.set_policy(session, body, settings.spare_target_percent)
    return SparePolicyRead.model_validate(policy)
