"""The failover controller: a rented GPU turns ``failed`` -> a spare of its model in its
datacenter is chosen (same topology group, then same node, preferred), reserved and requested
from the orchestrator by an event; its ``resumed`` answer records the migration through the
rentals service. Hot spares follow a policy per model and datacenter, and idle ones may be
rented preemptibly: a failover that needs one preempts that rental.

Concurrency: a spare is reserved with its ``gpus`` row locked (as assigning a GPU locks it),
then checked again and recorded; a unique index backs it, so no spare is promised twice,
neither to two failovers nor to a failover and a new rental. The lock waits a bounded time
(ingest holds its own node's rows while this runs in its transaction): a spare that stays
locked is passed over for the next one, so two ingests never deadlock.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.auth.service import Principal
from app.core.epoch import epoch, from_epoch
from app.core.errors import ApiError, Conflict, Unprocessable, not_found
from app.core.metrics import (
    FAILOVER_DETECTION_SECONDS,
    FAILOVER_REQUEST_SECONDS,
    FAILOVER_RESUME_SECONDS,
)
from app.events.models import DomainEvent
from app.failover import jobs, repository
from app.failover.models import Failover, FailoverState, FailoverTrigger, SparePolicy
from app.failover.pool import FAILED, available, check_pool, pool_counts
from app.failover.schemas import (
    FailoverSummary,
    LatencyFigures,
    SiteLatency,
    SparePolicyWrite,
    SparePoolRead,
)
from app.failover.transitions import close, iso, publish_failover
from app.fleet import service as fleet
from app.fleet.models import Gpu, Node, Pool
from app.fleet.schemas import SiteGpu
from app.metering import reads
from app.rentals import service as rentals
from app.rentals.models import Rental
from app.rentals.ports import RentalGpu
from app.rentals.schemas import MigrationCreate
from app.settings import Settings

# How long a reservation waits for a spare's row that another transaction holds (an ingest
# of the spare's node takes milliseconds); then the next spare is tried.
SPARE_LOCK_WAIT_MS = 250
# How far back the failed run's first second is looked for (it has just begun).
FAILED_RUN_LOOKBACK_S = 86_400
HEALTHY = "healthy"

# Why the orchestrator running a rental's job cannot move it onto a spare (a Slurm job
# submitted --no-requeue), None when it can; set by the composition root, asked before a spare
# is reserved.
MoveRefusal = Callable[[Session, uuid.UUID], str | None]
_move_checks: list[MoveRefusal] = []


def add_move_check(check: MoveRefusal) -> None:
    """Ask ``check`` before a spare is reserved for a rental; idempotent."""
    if check not in _move_checks:
        _move_checks.append(check)


def _now() -> datetime:
    return datetime.now(UTC)


def _second(moment: datetime) -> datetime:
    """Attribution is to the second (billing rates whole seconds)."""
    return moment.replace(microsecond=0)


# --- reacting to telemetry (subscriber of gpu.state_changed, in ingest's transaction) -------


@dataclass(frozen=True)
class FailoverSettings:
    """The settings the failover controller follows, handed in by its callers."""

    reservation_ttl_s: int  # a reserved spare waits this long for the orchestrator's answer
    max_clock_skew_s: int  # a resume this far in the future is still believed
    spare_target_percent: Decimal  # the spare pool's target where no policy sets one

    @classmethod
    def of(cls, settings: Settings) -> FailoverSettings:
        return cls(
            settings.failover_reservation_ttl_s,
            settings.max_clock_skew_s,
            settings.spare_target_percent,
        )


def on_gpu_state_changed(session: Session, event: DomainEvent, config: FailoverSettings) -> None:
    """A rented GPU failed: open its failover (a spare reserved for the reservation time); a
    GPU back to healthy: repaired."""
    data = event.data
    if data["to_state"] == FAILED:
        seen = epoch(datetime.fromisoformat(data["seen_at"]))
        failed_at = _first_failed_second(session, data["gpu_uuid"], seen)
        evidence = list(data["evidence"])
        open_failover(session, data["gpu_uuid"], failed_at, event.occurred_at, evidence, config)
    elif data["to_state"] == HEALTHY:
        repaired(session, data["gpu_uuid"], config.spare_target_percent)


def _first_failed_second(session: Session, gpu_uuid: str, seen: int) -> datetime:
    """The start of the failed run the GPU is in at ``seen`` (its last reported second + 1)."""
    lo = seen - FAILED_RUN_LOOKBACK_S
    timeline = reads.timeline(session, gpu_uuid, [(lo, seen)], lo, seen)
    failed = [s for s in timeline.segments if s.state == FAILED and s.end_s == seen]
    return from_epoch(failed[-1].start_s if failed else seen - 1)


def open_failover(
    session: Session,
    gpu_uuid: str,
    failed_at: datetime,
    detected_at: datetime,
    evidence: list[dict[str, Any]],
    config: FailoverSettings,
    degraded_causes: Collection[str] = (),
) -> Failover | None:
    """Open the failover of a rented GPU that failed at ``failed_at``: a spare reserved for
    ``config.reservation_ttl_s`` and ``failover.requested``, or ``failover.no_spare``. None when the
    GPU serves no (regular) rental or already has an open failover (a re-sent state change).
    With ``degraded_causes``, the GPU is degraded and its plan's spare policy moves it (from
    ``failed_at``, the second it was decided)."""
    site = fleet.gpu_site(session, gpu_uuid)
    if site is None:
        return None
    gpu, node = site
    holder = rentals.holder_at(session, gpu_uuid, failed_at)
    rental = None if holder is None else rentals.rental_by_id(session, holder.rental_id)
    if rental is None or rental.preemptible or repository.open_failover_of(session, gpu_uuid):
        # Preemptible rentals are best effort (credited, not failed over); a failed spare
        # shrinks the pool.
        if gpu.pool == Pool.SPARE:
            check_pool(session, node.datacenter, gpu.model, config.spare_target_percent)
        return None
    now = _now()
    failover = Failover(
        id=uuid.uuid4(),
        rental_id=rental.id,
        customer_id=rental.customer_id,
        failed_gpu_uuid=gpu_uuid,
        datacenter=node.datacenter,
        model=gpu.model,
        topology_group=node.topology_group,
        failed_at=failed_at,
        detected_at=detected_at,
        requested_at=now,
        evidence=evidence or _segment_evidence(session, gpu_uuid, failed_at),
        trigger=(FailoverTrigger.DEGRADED if degraded_causes else FailoverTrigger.FAILED).value,
        degraded_causes=sorted(degraded_causes),
    )
    labels = (node.datacenter, gpu.model, failover.trigger)
    FAILOVER_DETECTION_SECONDS.labels(*labels).observe(_seconds(failed_at, detected_at))
    if (refusal := _move_refused(session, rental.id)) is not None:
        _abandon_unmovable(session, failover, refusal, now)
        return failover
    spare = _reserve_spare(session, failover, gpu, node, now, config.reservation_ttl_s)
    FAILOVER_REQUEST_SECONDS.labels(*labels).observe(_seconds(failed_at, now))
    if spare is None:
        publish_failover(session, "failover.no_spare", failover)
    else:
        publish_failover(session, "failover.requested", failover)
    check_pool(session, node.datacenter, gpu.model, config.spare_target_percent)
    return failover


def _move_refused(session: Session, rental_id: uuid.UUID) -> str | None:
    return next((r for check in _move_checks if (r := check(session, rental_id))), None)


def _abandon_unmovable(session: Session, failover: Failover, reason: str, now: datetime) -> None:
    """The job cannot be moved: the failover is abandoned with the reason before any spare is
    reserved, so no preemptible rental on a spare is preempted for a job that stays put."""
    failover.state, failover.reason, failover.closed_at = FailoverState.ABANDONED, reason, now
    session.add(failover)
    session.flush()
    publish_failover(session, "failover.abandoned", failover)


def _segment_evidence(session: Session, gpu_uuid: str, failed_at: datetime) -> list[dict]:
    """The failed run's own evidence (its starting health event), when the batch that carried
    the failed record had none (the event came in an earlier batch)."""
    start = epoch(failed_at)
    timeline = reads.timeline(session, gpu_uuid, [(start, start + 1)], start, start + 1)
    return [s.evidence for s in timeline.segments if s.evidence]


def _seconds(start: datetime, end: datetime) -> float:
    return max(0.0, (end - start).total_seconds())


def _reserve_spare(
    session: Session, failover: Failover, gpu: Gpu, node: Node, now: datetime, ttl: int
) -> SiteGpu | None:
    """Reserve the best free spare for the failover for ``ttl`` seconds (recorded, with its
    expiry job), or record that there is none."""
    for candidate in _ranked_spares(session, gpu, node, now):
        if not fleet.lock_gpu_within(session, candidate.uuid, SPARE_LOCK_WAIT_MS):
            continue
        # Checked again under the lock: what was committed meanwhile is now visible.
        fresh = {g.uuid: g for g in fleet.pool_site(session, gpu.model, node.datacenter, now)}
        current = fresh.get(candidate.uuid)
        held = repository.reservations(session, [candidate.uuid])
        if current is None or not available(current, held) or _began_now(current, now):
            continue
        failover.state = FailoverState.REQUESTED
        failover.spare_gpu_uuid = current.uuid
        failover.reserved_until = now + timedelta(seconds=ttl)
        if _recorded(session, failover, current, now):
            jobs.schedule_expiry(session, failover.id, failover.reserved_until)
            return current
    failover.state = FailoverState.NO_SPARE
    failover.spare_gpu_uuid = None
    failover.reserved_until = None
    failover.reason = f"no free {gpu.model} spare in {node.datacenter}: " + (
        "the degraded GPU serves on, billed by the plan's degraded rule, until it is repaired"
        if failover.degraded_causes
        else f"the rental is credited as failure from {failover.failed_at.isoformat()} until "
        "the GPU is repaired"
    )
    session.add(failover)
    session.flush()
    return None


def _began_now(spare: SiteGpu, now: datetime) -> bool:
    """A preemptible rental that began this very second cannot end at it: passed over."""
    return spare.held_since is not None and spare.held_since >= _second(now)


def _recorded(session: Session, failover: Failover, spare: SiteGpu, now: datetime) -> bool:
    """Insert the reservation and preempt the spare's preemptible rental, if any, or neither:
    False if the unique index says another failover holds the spare, or the rental cannot end
    now (this runs in ingest's transaction, which must not fail for it: the next spare is
    tried)."""
    try:
        with session.begin_nested():
            session.add(failover)
            session.flush()
            if spare.rental_id is not None:
                _preempt(session, failover, spare.rental_id, now)
    except (IntegrityError, ApiError):
        if failover in session:
            session.expunge(failover)
        failover.preempted_rental_id = None
        return False
    return True


def _ranked_spares(session: Session, gpu: Gpu, node: Node, now: datetime) -> list[SiteGpu]:
    """Free spares, best first: same topology group, then same node, then idle before rented
    preemptibly, then by UUID (deterministic)."""
    site = fleet.pool_site(session, gpu.model, node.datacenter, now)
    reserved = repository.reservations(session, [g.uuid for g in site])
    free = [g for g in site if g.uuid != gpu.uuid and available(g, reserved)]

    def rank(spare: SiteGpu) -> tuple[bool, bool, bool, str]:
        same_group = node.topology_group is not None and spare.topology_group == node.topology_group
        return (not same_group, spare.node_id != node.id, spare.rental_id is not None, spare.uuid)

    return sorted(free, key=rank)


def _preempt(session: Session, failover: Failover, rental_id: uuid.UUID, now: datetime) -> None:
    at = _second(now)
    rental = rentals.rental_by_id(session, rental_id)
    # The preempted customer reads this event: it names their own GPU, never the failover,
    # which is another tenant's (operators find it by ``preempted_rental_id``).
    reason = f"its GPU {failover.spare_gpu_uuid} was taken as the hot spare of a failed GPU"
    rentals.preempt(session, rental, at, reason)
    failover.preempted_rental_id = rental.id
    session.flush()


def repaired(session: Session, gpu_uuid: str, default_target: Decimal) -> None:
    """A failed GPU is healthy again: a failover still waiting for a spare is closed (the
    rental is served again, the credit ends with the failure), and an idle GPU joins the
    spare pool while its pool is below target (the policy, else ``default_target``)."""
    site = fleet.gpu_site(session, gpu_uuid)
    if site is None:
        return
    gpu, node = site
    waiting = repository.open_failover_of(session, gpu_uuid)
    if waiting is not None and waiting.state == FailoverState.NO_SPARE:
        close(session, waiting, FailoverState.RECOVERED, "the failed GPU was repaired")
        publish_failover(session, "failover.recovered", waiting)
    idle = rentals.holder_at(session, gpu_uuid, _now()) is None
    if (
        idle
        and gpu.pool == Pool.RENTABLE
        and pool_counts(session, node.datacenter, gpu.model, default_target)["below_target"]
    ):
        fleet.move_to_pool(session, gpu_uuid, Pool.SPARE, "repaired; spare pool below target")
    if gpu.pool == Pool.SPARE:
        check_pool(session, node.datacenter, gpu.model, default_target)


# --- the orchestrator's answers ---------------------------------------------------------------


def resume(
    session: Session, failover_id: uuid.UUID, resumed_at: datetime | None, config: FailoverSettings
) -> Failover:
    """The job runs on the spare since ``resumed_at``: the migration is recorded (the failed
    assignment ends at failed_at, the spare's begins at resumed_at; [failed_at, resumed_at) is
    credited). Resuming a resumed failover again returns it unchanged."""
    failover = _locked(session, failover_id)
    if failover.state == FailoverState.RESUMED:
        return failover
    _require(failover, FailoverState.REQUESTED, "resumed")
    now = _now()
    at = _second(resumed_at or now)
    if at < failover.failed_at:
        raise Unprocessable(
            f"resumed_at {at.isoformat()} is before the failure at "
            f"{failover.failed_at.isoformat()}",
            ("body", "resumed_at"),
        )
    if at > now + timedelta(seconds=config.max_clock_skew_s):
        raise Unprocessable(f"resumed_at {at.isoformat()} is in the future", ("body", "resumed_at"))
    spare = failover.spare_gpu_uuid
    assert spare is not None  # a requested failover holds a spare (table constraint)
    failover.resumed_at = at
    close(session, failover, FailoverState.RESUMED, None)  # releases the reservation first
    rental = rentals.rental_by_id(session, failover.rental_id)
    migration = rentals.migrate(
        session,
        rental,
        MigrationCreate(
            from_gpu_uuid=failover.failed_gpu_uuid,
            to_gpu_uuid=spare,
            failed_at=failover.failed_at,
            resumed_at=at,
            reason=f"failover {failover.id}" + _degraded_note(failover),
        ),
    )
    failover.migration_id = migration.id
    fleet.move_to_pool(session, spare, Pool.RENTABLE, f"serves rental {rental.id} (failover)")
    session.flush()
    FAILOVER_RESUME_SECONDS.labels(failover.datacenter, failover.model, failover.trigger).observe(
        _seconds(failover.failed_at, at)
    )
    publish_failover(session, "failover.resumed", failover)
    check_pool(session, failover.datacenter, failover.model, config.spare_target_percent)
    return failover


def _degraded_note(failover: Failover) -> str:
    causes = ", ".join(failover.degraded_causes)
    return f" (degraded: {causes})" if causes else ""


def abandon(
    session: Session, failover_id: uuid.UUID, reason: str, default_target: Decimal
) -> Failover:
    """The orchestrator gave up (the job will not move): the spare is released. Abandoning an
    abandoned failover again returns it unchanged."""
    failover = _locked(session, failover_id)
    if failover.state == FailoverState.ABANDONED:
        return failover
    if failover.state not in (FailoverState.REQUESTED, FailoverState.NO_SPARE):
        raise Conflict(
            f"failover {failover.id} is {failover.state.value}: only a requested or no-spare "
            "failover can be abandoned",
            ("path", "failover_id"),
        )
    close(session, failover, FailoverState.ABANDONED, reason)
    publish_failover(session, "failover.abandoned", failover)
    check_pool(session, failover.datacenter, failover.model, default_target)
    return failover


def _locked(session: Session, failover_id: uuid.UUID) -> Failover:
    failover = repository.locked_failover(session, failover_id)
    if failover is None:
        raise not_found("failover", failover_id, ("path", "failover_id"))
    return failover


def _require(failover: Failover, state: FailoverState, action: str) -> None:
    if failover.state != state:
        raise Conflict(
            f"failover {failover.id} is {failover.state.value}: only a {state.value} failover "
            f"can be {action}",
            ("path", "failover_id"),
        )


# --- the rentals service's assignment check ---------------------------------------------------


def refuse_reserved_spares(
    session: Session, claims: Sequence[tuple[RentalGpu, Rental]]
) -> list[ApiError | None]:
    """No new rental (or manual migration) takes a spare a failover holds: each claim's
    refusal, or None. Called with the GPUs' rows locked, which a reservation also takes, so
    the two are checked in turn."""
    held = repository.reservations(session, {gpu.uuid for gpu, _ in claims})
    return [_reserved_refusal(held.get(gpu.uuid), gpu, rental) for gpu, rental in claims]


def _reserved_refusal(held: Failover | None, gpu: RentalGpu, rental: Rental) -> ApiError | None:
    if held is None or held.rental_id == rental.id:
        return None
    return Conflict(
        f"GPU {gpu.uuid} is reserved as the spare of failover {held.id} until "
        f"{iso(held.reserved_until)}",
        ("body", "gpu_uuid"),
    )


# --- read interfaces (a scheduler's adapter) -------------------------------------------------


def requested_for_rental(session: Session, rental_id: uuid.UUID) -> Failover | None:
    """The rental's failover waiting for the orchestrator's answer, if any: the scheduler's
    view of the job is in flux until it is resumed or given up."""
    return repository.requested_for_rental(session, rental_id)


def moving_rentals(session: Session, rental_ids: Collection[uuid.UUID]) -> set[uuid.UUID]:
    """Those of these rentals with a failover waiting for the orchestrator's answer (as
    ``requested_for_rental``, one query for a scheduler's whole snapshot)."""
    return repository.moving_rentals(session, rental_ids)


def spare_pool_below_target(
    session: Session, datacenter: str, model: str, default_target: Decimal
) -> bool:
    return bool(pool_counts(session, datacenter, model, default_target)["below_target"])


# --- the spare pool ---------------------------------------------------------------------------


def pool_view(
    session: Session, start: datetime, end: datetime, default_target: Decimal
) -> list[SparePoolRead]:
    """Every (datacenter, model)'s spare pool now (against ``default_target`` where no policy
    sets one), and the spare GPU-seconds sold preemptibly in [start, end)."""
    if end <= start:
        raise Unprocessable("end must be after start", ("query", "end"))
    pools = []
    for datacenter, model in fleet.pool_sites(session):
        counts = pool_counts(session, datacenter, model, default_target)
        sold = rentals.preemptible_seconds(session, counts.pop("site_uuids"), start, end)
        pools.append(
            SparePoolRead(
                **counts,
                preemptible_gpu_seconds=sold,
                preemptible_gpu_hours=(Decimal(sold) / 3600).quantize(Decimal("0.001")),
                start=start,
                end=end,
            )
        )
    return pools


def set_policy(session: Session, data: SparePolicyWrite, default_target: Decimal) -> SparePolicy:
    policy = repository.upsert_policy(session, data.model_dump())
    check_pool(session, data.datacenter, data.model, default_target)
    return policy


# --- reads ------------------------------------------------------------------------------------


def get_failover(session: Session, failover_id: uuid.UUID, principal: Principal) -> Failover:
    failover = session.scalar(
        repository.readable_failovers(principal).where(Failover.id == failover_id)
    )
    if failover is None:
        raise not_found("failover", failover_id, ("path", "failover_id"))
    return failover


def summary(session: Session) -> FailoverSummary:
    """p50/p99 of detection, request and resume latency per datacenter, model and trigger,
    from the stored failovers (seconds from the first failed second, or from the second the
    plan's degraded policy moved the GPU): a failure's figures are never mixed with the
    degraded moves', which wait out the policy's threshold first."""
    sites = []
    for row in repository.latency_rows(session):
        datacenter, model, trigger, total, *figures = row
        triples = [figures[i : i + 3] for i in (0, 3, 6)]
        detection, request, resumed = (
            LatencyFigures(count=n, p50_s=_float(p50), p99_s=_float(p99)) for n, p50, p99 in triples
        )
        sites.append(
            SiteLatency(
                datacenter=datacenter,
                model=model,
                trigger=trigger,
                failovers=total,
                detection=detection,
                request=request,
                resume=resumed,
            )
        )
    return FailoverSummary(sites=sites)


def _float(value: object) -> float | None:
    return None if value is None else round(float(str(value)), 3)
