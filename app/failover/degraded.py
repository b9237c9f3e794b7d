"""Migration on degradation: a rented GPU degraded for its plan's ``migrate_degraded_after_s``
by one of the plan's ``migrate_degraded_causes`` is failed over to a spare, the same way as a
failed GPU (a spare reserved, ``failover.requested`` to the orchestrator, Slurm or webhook).

A degraded GPU may send no new event for as long as it stays degraded (its open segment is
only extended), so no state change tells the service when the time is up: a periodic job
(``check_degraded_gpus``, every ``CHECK_EVERY_S``) looks at the GPUs whose latest report is
degraded. One indexed query over ``gpus`` finds them (few, in a healthy fleet), so the check
costs nothing while no plan migrates and little when one does; the time from "due" to
"requested" is at most the check period plus an upload round.

Billing (``app.billing.core.rating``): the failover's window starts at the second the service
decided (``failed_at``) and is migration credit until the job resumes on the spare; the
degraded seconds before it stay where the plan puts degraded time (billed unless the plan
credits degraded). One try per degraded run: an expired or abandoned one is not asked again
until the GPU has been healthy in between.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import procrastinate
from procrastinate import job_context
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.core.db import transaction
from app.core.epoch import epoch, from_epoch
from app.failover import repository
from app.failover.models import Failover
from app.failover.service import FailoverSettings, open_failover
from app.fleet import service as fleet
from app.metering import reads
from app.metering.causes import causes_of
from app.metering.schemas import SegmentRead
from app.plans.service import DegradedPolicy, degraded_policies
from app.rentals import service as rentals

log = logging.getLogger(__name__)

DEGRADED = "degraded"
CHECK_EVERY_S = 5
# A GPU whose last report is older than this is not reporting: its degraded run is not known
# to go on (unmetered time is not degradation), so it is not moved on its account.
REPORTING_WITHIN_S = 120
# GPUs looked at per check (the rest wait for the next one: the check stays short).
GPUS_PER_CHECK = 500
# How far back a degraded run is read (the longest policy is a day).
RUN_LOOKBACK_S = 2 * 86_400

tasks = procrastinate.Blueprint()


@tasks.periodic(cron=f"* * * * * */{CHECK_EVERY_S}")
@tasks.task(name="degraded", queueing_lock="failover_degraded", pass_context=True)
def check_degraded_gpus(context: job_context.JobContext, timestamp: int) -> int:
    """Every few seconds: fail over the rented GPUs degraded for their plan's time; how many."""
    engine, settings = context.additional_context["engine"], context.additional_context["settings"]
    with transaction(engine) as session:
        return len(check_degraded(session, datetime.now(UTC), FailoverSettings.of(settings)))


def check_degraded(session: Session, now: datetime, config: FailoverSettings) -> list[Failover]:
    """Open the failover of each rented GPU its plan's policy says has been degraded long
    enough; the failovers opened."""
    policies = degraded_policies(session)
    if not policies:
        return []
    seen_since = now - timedelta(seconds=REPORTING_WITHIN_S)
    gpus = fleet.gpus_in_state(session, DEGRADED, seen_since, GPUS_PER_CHECK)
    held = {
        gpu: holding
        for gpu, holding in zip(gpus, rentals.holdings_at(session, gpus, now), strict=True)
        if holding.rental_id is not None and not holding.rental_preemptible
    }
    if not held:
        return []
    hi = epoch(now) + 1
    lo = hi - RUN_LOOKBACK_S
    timelines = reads.timelines(session, {gpu: [(lo, hi)] for gpu in held}, lo, hi)
    opened = []
    for gpu, holding in held.items():
        assert holding.rental_id is not None and holding.held_since is not None  # held above
        policy = policies.get(rentals.rental_by_id(session, holding.rental_id).plan_id)
        runs = timelines[gpu].segments
        if policy is None or not runs or runs[-1].state != DEGRADED:
            continue
        run = runs[-1]
        failover = _migrate_if_due(
            session, gpu, run, epoch(holding.held_since), policy, now, config
        )
        if failover is not None:
            opened.append(failover)
    return opened


def _migrate_if_due(
    session: Session,
    gpu: str,
    run: SegmentRead,
    held_since: int,
    policy: DegradedPolicy,
    now: datetime,
    config: FailoverSettings,
) -> Failover | None:
    """The failover of ``gpu`` if its degraded ``run`` (rented since ``held_since``) is due."""
    since = max(run.start_s, held_since)
    causes = causes_of(run.evidence) & policy.causes
    if not causes or run.end_s - since < policy.after_s:
        return None
    if repository.open_failover_of(session, gpu) or repository.degraded_failover_since(
        session, gpu, from_epoch(since)
    ):
        return None
    # Never before the plan's time: the run's end is the agent's labelled second, which may
    # be a fraction ahead of this clock's whole second.
    decided = max(now.replace(microsecond=0), from_epoch(since + policy.after_s))
    evidence = [
        {
            **(run.evidence or {}),
            "kind": "degraded",  # a Slurm drain reason reads "degraded <rule>"
            "degraded_since": from_epoch(since).isoformat(),
            "due_at": from_epoch(since + policy.after_s).isoformat(),
            "after_s": policy.after_s,
        }
    ]
    try:
        # Ingest may open this GPU's failover (it just failed) meanwhile: the unique index on
        # open failovers decides, and this check leaves it to that one.
        with session.begin_nested():
            failover = open_failover(session, gpu, decided, now, evidence, config, sorted(causes))
    except IntegrityError:
        return None
    if failover is not None:
        log.info(
            "degraded GPU failed over",
            extra={"gpu_uuid": gpu, "causes": sorted(causes), "failover_id": str(failover.id)},
        )
    return failover
