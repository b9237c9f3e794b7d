"""The Slurm adapter's API. The adapter runs beside slurmctld with a scheduler key
(``POST /v1/keys/scheduler``): snapshots, its actions and their outcomes, nothing else; account
mappings and the job list need an admin key."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query

from app.auth.deps import Admin, SchedulerAdapter
from app.core.deps import AppSettings, DbSession
from app.core.pagination import Page, Paging, paginate
from app.failover.schemas import AbandonedBody
from app.failover.service import FailoverSettings
from app.slurm import repository, service
from app.slurm.models import NAME_LENGTH
from app.slurm.schemas import (
    AccountMapping,
    AccountRead,
    ActionDone,
    ActionRead,
    ActionResumed,
    JobRead,
    Layout,
    NodeResumedByHand,
    SlurmName,
    Snapshot,
    SnapshotResult,
)

router = APIRouter(prefix="/v1/slurm", tags=["slurm"])
AccountName = Annotated[str, Path(min_length=1, max_length=NAME_LENGTH, pattern=r"^[^\s=,]+$")]
ClusterName = Annotated[str, Query(min_length=1, max_length=NAME_LENGTH)]
ActionId = Annotated[int, Path(ge=1, le=2**63 - 1)]
NodeName = Annotated[str, Path(min_length=1, max_length=NAME_LENGTH, pattern=r"^[^\s=,]+$")]


@router.put("/accounts/{account}")
def map_account(
    account: AccountName, body: AccountMapping, session: DbSession, caller: Admin
) -> AccountRead:
    """Bill the Slurm account's jobs to this customer on this plan (from their next snapshot;
    jobs already attributed keep their rental)."""
    return AccountRead.model_validate(service.map_account(session, account, body, caller))


@router.get("/accounts")
def list_accounts(session: DbSession, _: Admin, page: Paging) -> Page[AccountRead]:
    return paginate(session, repository.accounts_query(), page, AccountRead)


@router.delete("/accounts/{account}", status_code=204)
def unmap_account(account: AccountName, session: DbSession, _: Admin) -> None:
    """The account's new jobs are no longer attributed (each is reported as unknown_account)."""
    service.unmap_account(session, account)


@router.post("/snapshots")
def record_snapshot(body: Snapshot, session: DbSession, _: SchedulerAdapter) -> SnapshotResult:
    """What Slurm says about its jobs now (``squeue --json --states=all``): each job holding
    GPUs becomes or moves its rental. Idempotent; the result lists the jobs that could not be
    attributed and why."""
    return service.record_snapshot(session, body)


@router.get("/jobs")
def list_jobs(
    session: DbSession, _: Admin, page: Paging, cluster: SlurmName | None = None
) -> Page[JobRead]:
    """The jobs seen holding GPUs, each with its rental or the reason it has none."""
    return paginate(session, repository.jobs_query(cluster), page, JobRead)


@router.get("/actions")
def pending_actions(
    session: DbSession, _: SchedulerAdapter, page: Paging, cluster: ClusterName
) -> Page[ActionRead]:
    """What the adapter is to do in the cluster (drain and requeue, resume), oldest first."""
    return paginate(session, repository.pending_actions_query(cluster), page, ActionRead)


@router.post("/actions/{action_id}/done")
def action_done(
    action_id: ActionId,
    body: ActionDone,
    session: DbSession,
    _: SchedulerAdapter,
) -> ActionRead:
    return ActionRead.model_validate(service.complete_action(session, action_id, body.outcome))


@router.post("/actions/{action_id}/resumed")
def failover_resumed(
    action_id: ActionId,
    body: ActionResumed,
    session: DbSession,
    _: SchedulerAdapter,
    settings: AppSettings,
) -> ActionRead:
    """The failover action's job runs on the spare since ``resumed_at`` (Slurm's start time):
    its failover is resumed (the migration recorded) and the action done."""
    config = FailoverSettings.of(settings)
    action = service.failover_resumed(session, action_id, body.resumed_at, config)
    return ActionRead.model_validate(action)


@router.post("/actions/{action_id}/abandoned")
def failover_abandoned(
    action_id: ActionId,
    body: AbandonedBody,
    session: DbSession,
    _: SchedulerAdapter,
    settings: AppSettings,
) -> ActionRead:
    """Slurm cannot move the failover action's job (the reason says why): its failover is
    abandoned, the spare released, and the action done."""
    target = settings.spare_target_percent
    action = service.failover_abandoned(session, action_id, body.reason, target)
    return ActionRead.model_validate(action)


@router.get("/layout")
def layout(session: DbSession, _: SchedulerAdapter) -> Layout:
    """Which nodes are hot spares and which serve jobs, by gpumeter's pools (the adapter
    holds the spares in a Slurm reservation)."""
    return service.layout(session)


@router.post("/nodes/{node}/resumed-by-hand")
def node_resumed_by_hand(
    node: NodeName, body: NodeResumedByHand, session: DbSession, _: SchedulerAdapter
) -> ActionRead:
    """The adapter found a node gpumeter drained for a failed GPU back in service, resumed by
    someone else: recorded as the node's repair (done) and reported once
    (``slurm.node_resumed_by_hand``); gpumeter does not drain it again."""
    action = service.node_resumed_by_hand(session, body.cluster, node, body.state)
    return ActionRead.model_validate(action)
