"""Slurm in the loop: jobs become rentals, failovers become scheduler actions.

Attribution is from Slurm's own job records, which the adapter sends as snapshots
(``squeue --json --states=all``, which lists running jobs and, for ``MinJobAge``, ended ones).
A snapshot is idempotent, so a repeated or late one changes nothing and a missed poll is caught
up by the next: a job's run is identified by Slurm's restart count, a higher count is a requeue
whose ``submit_time`` is the second the previous run ended, and an ended job carries its end.
Each GPU a job holds is named by node and GRES index, which the adapter names by device file
from gres.conf; the agent reports each GPU's minor number (and device index), which is how a
device becomes a UUID (``app.slurm.identity``). A job that cannot be attributed (an account
mapped to no customer, a node no agent reports, a GPU with no UUID, a shard, MPS or MIG job,
a rental the rules refuse) is kept with its reason, counted, logged and published once as
``slurm.job_unattributed``, and attributed by the first snapshot after the cause is fixed.

A failover of a Slurm job's GPU becomes a ``failover`` action (drain the failed node, requeue
the job onto the spare's node); while it is under way the job's snapshots are deferred, so the
migration the adapter reports (``resumed``) and the requeue's new run never contradict each
other. A failed GPU healthy again on a node gpumeter drained becomes a ``repair`` action.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from sqlalchemy.orm import Session

from app.auth.service import Principal
from app.core.epoch import epoch, from_epoch
from app.core.errors import ApiError, Conflict, Unprocessable, not_found
from app.core.metrics import SLURM_JOB_PROBLEMS
from app.customers import service as customers
from app.events.models import DomainEvent
from app.events.service import publish
from app.failover import service as failover
from app.fleet import service as fleet
from app.fleet.models import Gpu, Pool
from app.plans import service as plans
from app.rentals import service as rentals
from app.rentals.models import Rental
from app.rentals.schemas import AssignmentCreate, RentalCreate
from app.rentals.service import NewRental
from app.slurm import identity, repository
from app.slurm.models import ActionKind, SlurmAccount, SlurmAction, SlurmJob
from app.slurm.schemas import (
    REASON_PREFIX,
    RUNNING_STATES,
    AccountMapping,
    JobObservation,
    JobProblem,
    Layout,
    NodeGpus,
    Snapshot,
    SnapshotResult,
    ended,
    requeue_settling,
    run_end,
)

log = logging.getLogger(__name__)

REASON_LENGTH = 500
# An unchanged job's last-seen second moves on this often (not each round: 10,000 row writes
# a second); a job that vanishes from every record is ended at most this early, and reported.
LAST_SEEN_STEP = timedelta(seconds=30)


# --- account mappings -------------------------------------------------------------------------


def map_account(
    session: Session, account: str, data: AccountMapping, principal: Principal
) -> SlurmAccount:
    """Bill the account's jobs to this customer on this plan (checked now, not at the first
    job: a wrong mapping is a 4xx here, not a problem later)."""
    customer = customers.get_customer(session, data.customer_id, principal)
    plan = plans.get_plan(session, data.plan_id, principal)
    if plan.currency != customer.currency:
        raise Unprocessable(
            f"plan {plan.name!r} is priced in {plan.currency} but customer {customer.name!r} is "
            f"billed in {customer.currency}",
            ("body", "plan_id"),
        )
    return repository.upsert_account(session, account, customer.id, plan.id)


def unmap_account(session: Session, account: str) -> None:
    row = session.get(SlurmAccount, account)
    if row is None:
        raise not_found("Slurm account", account, ("path", "account"))
    session.delete(row)
    session.flush()


# --- attribution ------------------------------------------------------------------------------


@dataclass
class _Snapshot:
    """One snapshot's lookups, read once for all its jobs."""

    cluster: str
    now: datetime
    accounts: dict[str, SlurmAccount]
    nodes: dict[str, list[Gpu]]
    held: dict[uuid.UUID, Rental] = field(default_factory=dict)  # the changed jobs' rentals
    moving: set[uuid.UUID] = field(default_factory=set)  # of those, with a failover under way
    ending: list[tuple[SlurmJob, JobObservation]] = field(default_factory=list)
    opening: list[tuple[SlurmJob, JobObservation, NewRental]] = field(
        default_factory=list
    )  # the snapshot's ended jobs and new runs, each done together
    attributed: int = 0
    unchanged: int = 0
    deferred: int = 0
    problems: list[JobProblem] = field(default_factory=list)
    too_new: list[int] = field(default_factory=list)

    def begun(self, job: JobObservation, start: int) -> bool:
        """Whether the run's first second is past: a run seen in the second it began may end
        in it (cancelled at once), and a rental cannot last no second. Sent again later."""
        if start < self.now.timestamp() or ended(job):
            return True
        self.too_new.append(job.job_id)
        return False


class _Unattributable(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason, self.detail = reason, detail


def record_snapshot(session: Session, snapshot: Snapshot) -> SnapshotResult:
    """Most of a round's jobs are as they were: they are read, not locked, and only their
    last-seen second is moved on (every ``LAST_SEEN_STEP_S``, in one statement); the jobs that
    changed are locked and attributed, the GPUs of their nodes locked first as ingest locks
    them (``fleet.lock_gpus_as_ingest``: the two wait in turn, never deadlock)."""
    repository.plan_for_each_snapshot(session)
    ids = [job.job_id for job in snapshot.jobs]
    now = from_epoch(snapshot.taken_at)
    seen = repository.jobs(session, snapshot.cluster, ids)
    changed = [job for job in snapshot.jobs if _changed(seen.get(job.job_id), job)]
    repository.touch_seen(session, snapshot.cluster, list(seen), now, LAST_SEEN_STEP)
    known = repository.locked_jobs(session, snapshot.cluster, [job.job_id for job in changed])
    context = _Snapshot(
        cluster=snapshot.cluster,
        now=now,
        accounts=repository.accounts(session, {job.account for job in changed}),
        nodes=fleet.gpus_of_nodes(session, {a.node for job in changed for a in job.allocation}),
        unchanged=len(snapshot.jobs) - len(changed),
    )
    fleet.lock_gpus_as_ingest(session, [gpu for gpus in context.nodes.values() for gpu in gpus])
    held = [row.rental_id for row in known.values() if row.rental_id is not None]
    context.held = {r.id: r for r in rentals.with_assignments(session, held)}
    context.moving = failover.moving_rentals(session, held)
    # Ends first: a GPU a job let go at t may be the one another job took at t; new runs last.
    for job in sorted((j for j in changed if _letting_go(j)), key=lambda j: j.job_id):
        _observe(session, context, known.get(job.job_id), job)
    _end_rentals(session, context)
    for job in sorted((j for j in changed if not _letting_go(j)), key=lambda j: j.job_id):
        _observe(session, context, known.get(job.job_id), job)
    _open_rentals(session, context)
    for row in repository.locked_jobs(session, snapshot.cluster, snapshot.forgotten).values():
        if row.rental_id is not None and row.ended_at is None:
            _vanished(session, context, row)
    missing = []
    if snapshot.complete:
        for row in repository.open_jobs_missing(session, snapshot.cluster, ids):
            _vanished(session, context, row)
    elif snapshot.delta:
        missing = repository.open_job_ids(session, snapshot.cluster, snapshot.gone)
    else:
        missing = repository.open_job_ids_missing(session, snapshot.cluster, ids)
    return SnapshotResult(
        attributed=context.attributed,
        unchanged=context.unchanged,
        deferred=context.deferred,
        problems=context.problems,
        missing=missing,
        too_new=context.too_new,
    )


def _changed(row: repository.SeenJob | None, job: JobObservation) -> bool:
    """Whether the record says anything the job's row does not: a run, a state, a restart, an
    end, a node; or the job is still to be attributed."""
    if row is None:
        return (bool(job.allocation) and job.start_time is not None) or _ran_unseen(job)
    if row.ended_at is not None:
        return False
    if row.rental_id is None or row.problem is not None or job.runs or ended(job):
        return True
    if (row.state, row.restarts) != (job.state, job.restarts):
        return True
    start = None if job.start_time is None else from_epoch(job.start_time)
    running = job.state in RUNNING_STATES
    return running and (row.run_start_at != start or row.nodes != [a.node for a in job.allocation])


def _ran_unseen(job: JobObservation) -> bool:
    """Accounting has a run of a second or more of a job first seen holding no GPUs: it began
    and ended between two rounds (on a spare the moment it was let go, say); reported."""
    return any(run.end is not None and run.end > run.start for run in job.runs or [])


def _letting_go(job: JobObservation) -> bool:
    return ended(job) or job.state not in RUNNING_STATES or bool(job.runs)


def _observe(session: Session, ctx: _Snapshot, row: SlurmJob | None, job: JobObservation) -> None:
    if row is None:
        if (not job.allocation or job.start_time is None) and not _ran_unseen(job):
            ctx.unchanged += 1  # holds no GPUs, or has not run yet
            return
        row = SlurmJob(
            cluster=ctx.cluster, job_id=job.job_id, account=job.account, state=job.state,
            restarts=job.restarts, nodes=[], last_seen_at=ctx.now,
        )  # fmt: skip
        session.add(row)
    if row.ended_at is not None:
        ctx.unchanged += 1
        return
    row.state, row.last_seen_at = job.state, max(row.last_seen_at, ctx.now)
    row.requeue_refusal = job.requeue_refusal()
    try:
        if row.rental_id is None:
            if _first_run(session, ctx, row, job):
                return  # opened with the snapshot's other new runs
            changed = False
        elif _just_ended(ctx, row, job):
            ctx.ending.append((row, job))  # ended with the snapshot's other ended jobs
            return
        else:
            with session.begin_nested():
                changed = _attribute(session, ctx, row, job)
    except _Unattributable as problem:
        _record_problem(session, ctx, row, problem)
        return
    except _Deferred:
        ctx.deferred += 1
        return
    _settled(ctx, row, changed)


def _settled(ctx: _Snapshot, row: SlurmJob, changed: bool) -> None:
    if row.rental_id is not None:  # a job never attributed keeps its reason
        row.problem = None
    if changed:
        ctx.attributed += 1
    else:
        ctx.unchanged += 1


def _just_ended(ctx: _Snapshot, row: SlurmJob, job: JobObservation) -> bool:
    """The job ended in the run last attributed, with no failover of it under way: all there
    is to do is end its rental, which ``_end_rentals`` does for all such jobs at once."""
    return ended(job) and job.restarts == row.restarts and row.rental_id not in ctx.moving


def _end_rentals(session: Session, ctx: _Snapshot) -> None:
    """The snapshot's just-ended jobs end their rentals together (``rentals.end_rentals``, one
    flush for all); one the rules refuse is reported."""
    due = []
    for row, job in ctx.ending:
        assert row.rental_id is not None and job.end_time is not None
        rental, at = ctx.held[row.rental_id], from_epoch(job.end_time)
        if rental.end_at is None and at <= rental.start_at:
            _record_problem(session, ctx, row, _bad_end(at))
        else:
            due.append((row, rental, at))
    still_open = [(row, rental, at) for row, rental, at in due if rental.end_at is None]
    ended_now = rentals.end_rentals(session, [(rental, at) for _, rental, at in still_open])
    answers = {row.job_id: a for (row, _, _), a in zip(still_open, ended_now, strict=True)}
    for row, rental, at in due:
        answer = answers.get(row.job_id, rental)  # a rental ended already ends the job too
        if isinstance(answer, ApiError):
            _record_problem(session, ctx, row, _Unattributable("rental_refused", str(answer)))
            continue
        row.ended_at = at
        _settled(ctx, row, True)


class _Deferred(Exception):
    """A failover of the job is under way."""


def _attribute(session: Session, ctx: _Snapshot, row: SlurmJob, job: JobObservation) -> bool:
    """Bring the attributed job's rental in line with what Slurm says; whether anything
    changed."""
    assert row.rental_id is not None
    rental = ctx.held[row.rental_id]
    if rental.id in ctx.moving:
        raise _Deferred
    if requeue_settling(job, row.restarts):
        return False
    changed = False
    if job.restarts > row.restarts:
        # Requeued since the run last attributed: that run ended when accounting says, else at
        # the requeue; neither known yet, the job waits for a later snapshot.
        previous = None if row.run_start_at is None else epoch(row.run_start_at)
        end = _previous_run_end(job, previous)
        if end is None:
            return False
        if end == previous:  # requeued in the second it began: it held its GPUs no whole second
            changed |= rentals.withdraw_assignments(session, rental, from_epoch(end))
        else:
            changed |= _end_open(session, rental, from_epoch(end))
        _report_unseen_runs(session, ctx, row, job, previous)
        row.restarts, row.run_start_at, row.nodes = job.restarts, None, []
    if ended(job):
        assert job.end_time is not None
        changed |= _end_rental(session, rental, from_epoch(job.end_time))
        row.ended_at = from_epoch(job.end_time)
        return True
    if job.state in RUNNING_STATES and job.start_time is not None:
        changed |= _follow_run(session, ctx, row, rental, job)
    return changed


def _previous_run_end(job: JobObservation, previous: int | None) -> int | None:
    """The second the run last attributed (begun at ``previous``) ended: accounting's, else the
    requeue's (the requeued record's submit time), believed only when it is after the run
    began. A record read in the moment of its requeue may still carry the job's earlier
    submit time, and accounting lags slurmctld under load: ending the run there would end
    none of its GPUs, which would run on into the next run as if it had begun with the first."""
    if previous is None:
        return job.submit_time  # that run was ended already, at an earlier requeue
    accounted = run_end(job, previous)
    if accounted is not None:
        return accounted
    return job.submit_time if job.submit_time > previous else None


def _report_unseen_runs(
    session: Session, ctx: _Snapshot, row: SlurmJob, job: JobObservation, previous: int | None
) -> None:
    """Runs accounting has between the one last attributed and the current one ran unseen
    (the adapter away, or a run seen only in its first second): which GPUs they held is not
    in accounting, so they are reported."""
    current = job.start_time if job.allocation else None  # attributed from the snapshot
    unseen = [
        r for r in job.runs or []
        if (previous is None or r.start > previous) and r.start != current
        and r.end is not None and r.end > r.start
    ]  # fmt: skip
    if unseen:
        spans = ", ".join(f"{r.start}-{r.end} on {','.join(r.nodes)}" for r in unseen)
        _record_problem(
            session, ctx, row,
            _Unattributable(
                "unseen_runs",
                f"job {row.job_id} ran unseen ({spans}); accounting does not say which GPUs: "
                "keep the adapter's outages shorter than MinJobAge",
            ),
        )  # fmt: skip


def _first_run(session: Session, ctx: _Snapshot, row: SlurmJob, job: JobObservation) -> bool:
    """Queue the job's first run as a rental (``_open_rentals``); whether it was queued. Writes
    nothing else of rentals, so it needs no savepoint of its own."""
    if ended(job) and job.end_time is not None and job.end_time <= (job.start_time or 0):
        row.ended_at = from_epoch(job.end_time)  # ran for no whole second: nothing to bill
        return False
    if job.start_time is None or not job.allocation:
        # Requeued before it was ever attributed (a run seen only in its first second): the
        # run accounting has is reported; the next one is attributed.
        _report_unseen_runs(session, ctx, row, job, None)
        if ended(job) and job.end_time is not None:
            row.ended_at = from_epoch(job.end_time)  # nothing more to wait for
        return False
    if not ctx.begun(job, job.start_time):
        return False
    mapping = ctx.accounts.get(job.account)
    if mapping is None:
        raise _Unattributable(
            "unknown_account",
            f"Slurm account {job.account!r} is mapped to no customer: "
            f"PUT /v1/slurm/accounts/{job.account} with its customer_id and plan_id",
        )
    gpus = _gpus(ctx, job.allocation)
    models = sorted({gpu.model for gpu in gpus})
    if len(models) != 1:
        raise _Unattributable("mixed_models", f"the job holds GPUs of several models: {models}")
    end = from_epoch(job.end_time) if ended(job) and job.end_time is not None else None
    body = RentalCreate(
        customer_id=mapping.customer_id, plan_id=mapping.plan_id, gpu_model=models[0],
        gpu_count=len(gpus), start_at=from_epoch(job.start_time), end_at=end,
        name=f"slurm job {job.job_id}",
    )  # fmt: skip
    ctx.opening.append((row, job, NewRental(body, [gpu.uuid for gpu in gpus])))
    return True


def _open_rentals(session: Session, ctx: _Snapshot) -> None:
    """The snapshot's new runs become rentals together (``rentals.open_rentals``: a few
    statements for all); one the rules refuse is reported, and asked again next snapshot."""
    answers = rentals.open_rentals(session, [new for _, _, new in ctx.opening])
    for (row, job, _), answer in zip(ctx.opening, answers, strict=True):
        if isinstance(answer, ApiError):
            _record_problem(session, ctx, row, _Unattributable("rental_refused", str(answer)))
            continue
        row.rental_id, row.restarts, row.run_start_at = answer.id, job.restarts, answer.start_at
        row.nodes = [a.node for a in job.allocation]
        row.ended_at = answer.end_at
        _settled(ctx, row, True)


def _follow_run(
    session: Session, ctx: _Snapshot, row: SlurmJob, rental: Rental, job: JobObservation
) -> bool:
    """The run Slurm reports holds exactly its GPUs: new ones from the run's start (or, added
    to a run already attributed, from now), ones it let go end now."""
    assert job.start_time is not None
    start = from_epoch(job.start_time)
    new_run = row.run_start_at != start
    if new_run and not ctx.begun(job, job.start_time):
        return False
    gpus = {gpu.uuid for gpu in _gpus(ctx, job.allocation)}
    held = {a.gpu_uuid: a for a in rental.assignments if a.end_at is None}
    changed = False
    for gone in sorted(held.keys() - gpus):
        if held[gone].start_at < ctx.now:
            rentals.end_assignment(session, rental, held[gone].id, ctx.now)
            changed = True
    for gpu_uuid in sorted(gpus - held.keys()):
        since = start if new_run else ctx.now
        try:
            rentals.assign_gpu(session, rental, AssignmentCreate(gpu_uuid=gpu_uuid, start_at=since))
        except ApiError as refused:  # the GPU still held by another job, as gpumeter knows
            raise _Unattributable("rental_refused", str(refused)) from None
        changed = True
    row.run_start_at, row.nodes = start, [a.node for a in job.allocation]
    return changed


def _gpus(ctx: _Snapshot, allocation: list[NodeGpus]) -> list[Gpu]:
    """The GPUs Slurm gave the job, by node and device (``app.slurm.identity``)."""
    try:
        return identity.gpus_held(allocation, ctx.nodes)
    except identity.Unresolved as problem:
        raise _Unattributable(problem.reason, problem.detail) from None


def _end_open(session: Session, rental: Rental, at: datetime) -> bool:
    """End the rental's open assignments that began before ``at`` there (a spare's that a
    failover opened at the next run's start stays)."""
    ending = [a for a in rental.assignments if a.end_at is None and a.start_at < at]
    for assignment in ending:
        rentals.end_assignment(session, rental, assignment.id, at)
    return bool(ending)


def _end_rental(session: Session, rental: Rental, at: datetime) -> bool:
    if rental.end_at is not None:
        return False
    if at <= rental.start_at:
        raise _bad_end(at)
    try:
        rentals.end_rental(session, rental, at)
    except ApiError as refused:
        raise _Unattributable("rental_refused", str(refused)) from None
    return True


def _bad_end(at: datetime) -> _Unattributable:
    return _Unattributable("bad_end", f"the job ended at {at.isoformat()}, before it began")


def _vanished(session: Session, ctx: _Snapshot, row: SlurmJob) -> None:
    """An attributed job no longer in Slurm's records ended unseen (slurmctld forgot it after
    MinJobAge): it ends at the last second it was seen, and that is reported."""
    assert row.rental_id is not None
    rental = rentals.rental_by_id(session, row.rental_id)
    if failover.requested_for_rental(session, rental.id) is not None:
        ctx.deferred += 1
        return
    at = row.last_seen_at
    try:
        with session.begin_nested():
            _end_rental(session, rental, at)
    except _Unattributable as problem:
        _record_problem(session, ctx, row, problem)
        return
    row.ended_at = at
    _record_problem(
        session, ctx, row,
        _Unattributable(
            "vanished",
            f"job {row.job_id} left Slurm's records unseen; ended at {at.isoformat()}, the last "
            "second it was seen (raise MinJobAge above the adapter's longest outage)",
        ),
    )  # fmt: skip


def _record_problem(
    session: Session, ctx: _Snapshot, row: SlurmJob, problem: _Unattributable
) -> None:
    """Listed in every snapshot's result; counted, logged and published once per cause."""
    ctx.problems.append(JobProblem(job_id=row.job_id, reason=problem.reason, detail=problem.detail))
    text = f"{problem.reason}: {problem.detail}"[:REASON_LENGTH]
    if row.problem == text:
        return
    row.problem = text
    SLURM_JOB_PROBLEMS.labels(problem.reason).inc()
    log.warning(
        "slurm_job_unattributed",
        extra={"cluster": row.cluster, "job_id": row.job_id, "reason": problem.reason,
               "detail": problem.detail},
    )  # fmt: skip
    session.flush()
    publish(
        session,
        "slurm.job_unattributed",
        {"cluster": row.cluster, "job_id": row.job_id, "account": row.account,
         "reason": problem.reason, "detail": problem.detail, "rental_id": row.rental_id},
        subject=f"slurm/{row.cluster}/{row.job_id}",
    )  # fmt: skip


# --- failovers and repairs (subscribers, in the publishing transaction) ------------------------


def requeue_refusal(session: Session, rental_id: uuid.UUID) -> str | None:
    """Why Slurm cannot requeue the rental's job onto a spare (``--no-requeue``, interactive),
    as its last snapshot said; None for a job it can requeue, or a rental Slurm does not run.
    Asked before a spare is reserved: the failover is abandoned with this reason instead."""
    job = repository.job_of_rental(session, rental_id)
    return None if job is None or job.ended_at is not None else job.requeue_refusal


def on_failover_requested(session: Session, event: DomainEvent) -> None:
    """A spare is reserved for a Slurm job's failed GPU: ask the adapter to drain the failed
    node and requeue the job onto the spare's node (with the job's other nodes). (A job Slurm
    cannot requeue never gets here: ``requeue_refusal`` abandoned its failover.)"""
    data = event.data
    job = repository.job_of_rental(session, uuid.UUID(data["rental_id"]))
    failed = fleet.gpu_site(session, data["failed_gpu_uuid"])
    spare = fleet.gpu_site(session, data["spare_gpu_uuid"])
    if job is None or job.ended_at is not None or failed is None or spare is None:
        return
    failed_node, spare_node = failed[1].hostname, spare[1].hostname
    action = SlurmAction(
        kind=ActionKind.FAILOVER,
        cluster=job.cluster,
        node=failed_node,
        failover_id=uuid.UUID(data["failover_id"]),
        job_id=job.job_id,
        spare_node=spare_node,
        nodes_after=sorted((set(job.nodes) - {failed_node}) | {spare_node}),
        restarts_before=job.restarts,
        reason=drain_reason(failed[0], data["failover_id"], data["evidence"]),
    )
    repository.add_action(session, action)


def drain_reason(gpu: Gpu, failover_id: str, evidence: list[dict]) -> str:
    """What ``sinfo -R`` shows: gpumeter's evidence, in Slurm's one-line reason."""
    causes = [
        " ".join(str(part) for part in (e.get("kind"), e.get("code"), e.get("rule")) if part)
        for e in evidence
    ]
    index = "?" if gpu.device_index is None else gpu.device_index
    cause = "; ".join(dict.fromkeys(c for c in causes if c)) or "failed"
    text = f"{REASON_PREFIX} GPU {index} ({gpu.uuid}) {cause}; failover {failover_id}"
    return text[:REASON_LENGTH]


def on_failover_resumed(session: Session, event: DomainEvent) -> None:
    """The job runs on the spare's node: Slurm moves whole nodes, so the node's other spares
    serve the job too and leave the spare pool with the one the failover took."""
    data = event.data
    if repository.job_of_rental(session, uuid.UUID(data["rental_id"])) is None:
        return
    site = fleet.gpu_site(session, data["spare_gpu_uuid"])
    if site is None:
        return
    for gpu in fleet.gpus_of_nodes(session, [site[1].hostname]).get(site[1].hostname, []):
        if gpu.pool == Pool.SPARE:
            fleet.move_to_pool(
                session, gpu.uuid, Pool.RENTABLE, f"its node {site[1].hostname} serves a Slurm job"
            )


def on_gpu_state_changed(session: Session, event: DomainEvent, spare_target: Decimal) -> None:
    """A GPU healthy again on a node gpumeter drained, with no GPU of it still failed: the
    adapter is asked to repair the node (a reboot, then resume once slurmd's health check
    passes); if its spare pool is short (or the repaired GPU joined it), the whole
    node becomes a hot spare, as the spare it replaced was (``spare_target``: the
    ``spare_target_percent`` setting, for a pool with no policy)."""
    if event.data["to_state"] != "healthy":
        return
    site = fleet.gpu_site(session, event.data["gpu_uuid"])
    if site is None:
        return
    gpu, node = site
    drained = repository.last_failover_action_on_node(session, node.hostname)
    if drained is None or repository.repaired_since(session, drained):
        return
    gpus = fleet.gpus_of_nodes(session, [node.hostname])[node.hostname]
    if any(g.last_state == "failed" for g in gpus):
        return
    repair = SlurmAction(
        kind=ActionKind.REPAIR,
        cluster=drained.cluster,
        node=node.hostname,
        reason=f"{REASON_PREFIX} GPU {gpu.uuid} healthy again",
    )
    if not repository.add_action(session, repair):
        return
    short = failover.spare_pool_below_target(session, node.datacenter, gpu.model, spare_target)
    if short or any(g.pool == Pool.SPARE for g in gpus):
        now = datetime.now(UTC)
        for g in gpus:
            if g.pool == Pool.RENTABLE and rentals.holder_at(session, g.uuid, now) is None:
                fleet.move_to_pool(session, g.uuid, Pool.SPARE, "repaired: its node is a spare")


# --- the adapter's actions and layout ---------------------------------------------------------


def complete_action(session: Session, action_id: int, outcome: str) -> SlurmAction:
    """The adapter did it (or gave it up, saying why); done again changes nothing."""
    action = repository.locked_action(session, action_id)
    if action is None:
        raise not_found("Slurm action", action_id, ("path", "action_id"))
    if action.done_at is None:
        action.done_at, action.outcome = datetime.now(UTC), outcome
        session.flush()
    return action


def failover_resumed(
    session: Session, action_id: int, resumed_at: datetime, config: failover.FailoverSettings
) -> SlurmAction:
    """The action's job runs on the spare since ``resumed_at``: its failover is resumed and the
    action done, in one transaction. A failover that expired or was abandoned meanwhile (409)
    leaves the action done with that outcome."""
    action = _failover_action(session, action_id)
    if action.done_at is not None:
        return action
    assert action.failover_id is not None  # a failover action has one (table constraint)
    try:
        with session.begin_nested():
            failover.resume(session, action.failover_id, resumed_at, config)
    except Conflict as refused:
        return complete_action(session, action_id, f"not resumed: {refused}")
    where = f"job {action.job_id} runs on {action.spare_node} since {resumed_at.isoformat()}"
    return complete_action(session, action_id, where)


def failover_abandoned(
    session: Session, action_id: int, reason: str, spare_target: Decimal
) -> SlurmAction:
    """The adapter cannot move the action's job (``reason``): its failover is abandoned (the
    spare released) and the action done, in one transaction."""
    action = _failover_action(session, action_id)
    if action.done_at is not None:
        return action
    assert action.failover_id is not None
    try:
        with session.begin_nested():
            failover.abandon(session, action.failover_id, reason, spare_target)
    except Conflict as refused:
        reason = f"{reason} ({refused})"
    return complete_action(session, action_id, f"abandoned: {reason}"[:REASON_LENGTH])


def _failover_action(session: Session, action_id: int) -> SlurmAction:
    action = repository.locked_action(session, action_id)
    if action is None:
        raise not_found("Slurm action", action_id, ("path", "action_id"))
    if action.kind != ActionKind.FAILOVER:
        raise Conflict(
            f"Slurm action {action_id} is a {action.kind.value}, not a failover: POST its /done",
            ("path", "action_id"),
        )
    return action


def layout(session: Session) -> Layout:
    """gpumeter's nodes with GPUs: the hot spares (every GPU in the spare pool) and the rest."""
    known = fleet.gpus_of_nodes(session)
    spares = sorted(
        n for n, gpus in known.items() if gpus and all(g.pool == Pool.SPARE for g in gpus)
    )
    workers = sorted(n for n, gpus in known.items() if gpus and n not in spares)
    drained = repository.held_drained_nodes(session)
    return Layout(spare_nodes=spares, worker_nodes=workers, drained_nodes=drained)


def node_resumed_by_hand(session: Session, cluster: str, node: str, state: str) -> SlurmAction:
    """Someone resumed a node gpumeter drained for a failed GPU, before gpumeter asked for its
    repair: gpumeter does not drain it again (the operator's word stands; the node's health
    check drains it while a GPU is still failed), records that as the node's repair, done,
    and reports it once (``slurm.node_resumed_by_hand``)."""
    drained = repository.last_failover_action_on_node(session, node)
    if drained is None or drained.cluster != cluster:
        raise not_found("node gpumeter drained", node, ("path", "node"))
    if repository.repaired_since(session, drained):
        return repository.last_repair_action_on_node(session, cluster, node)
    gpus = fleet.gpus_of_nodes(session, [node]).get(node, [])
    failed = sorted(g.uuid for g in gpus if g.last_state == "failed")
    outcome = (
        f"resumed by hand (Slurm: {state}) while gpumeter held it drained for failover "
        f"{drained.failover_id}; GPUs failed now: {', '.join(failed) or 'none'}"
    )[:REASON_LENGTH]
    repair = SlurmAction(
        kind=ActionKind.REPAIR,
        cluster=cluster,
        node=node,
        reason=outcome,
        done_at=datetime.now(UTC),
        outcome=outcome,
    )
    repository.add_action(session, repair)
    detail = {"cluster": cluster, "node": node, "state": state, "failed_gpu_uuids": failed}
    log.warning("slurm_node_resumed_by_hand", extra=detail)
    data = {**detail, "failover_id": drained.failover_id}
    publish(session, "slurm.node_resumed_by_hand", data, subject=f"slurm/{cluster}/node/{node}")
    return repair


def _all_spare(gpus: list[Gpu]) -> bool:
    return all(gpu.pool == Pool.SPARE for gpu in gpus)
