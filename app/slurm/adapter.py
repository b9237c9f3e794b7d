"""The Slurm adapter: a process beside slurmctld that keeps gpumeter and Slurm in step.

Each round (``poll_s``, default 1 s) it reads every job (``squeue --json --states=all``),
carries out gpumeter's pending actions, sends the jobs as a snapshot (attribution), and keeps
the spare reservation holding gpumeter's hot spares. A round that cannot read Slurm sends
nothing (an empty snapshot would end every job), and is retried the next round.

The hot spares are held by a Slurm reservation (``--spare-reservation``, users root only): no
customer job lands on them, whatever partition it names. A hidden partition would not do:
anyone may name it.

A failover action, step by step, each step idempotent (an adapter restarted, or a slurmctld
that went away mid-way, repeats nothing and skips nothing):
1. a job Slurm cannot requeue (``--no-requeue``, interactive ``salloc``/``srun``) is given up
   at once, with the reason (the service gives it up before then when the snapshot said so);
2. drain the failed node, its reason gpumeter's evidence;
3. requeue the job, unless Slurm's restart count shows it was requeued since the failure
   (its nodes held first, step 4);
4. hold the survivors plus the spare's node in a reservation of their own (the job's user
   only), then requeue; place the pending job on them, starting now, in its own partition
   and QOS, and in that reservation: from the requeue until it runs there, no other job may
   take them (the spare's node stays in the spare reservation meanwhile; the survivors are
   free the moment the requeue ends the run);
5. once it runs there, end its reservation and report ``resumed`` at Slurm's start time, or
   end it and report ``abandoned`` with the reason when it cannot (the job ended, ran
   elsewhere, or did not run by the deadline). The spare's node leaves the spare reservation
   once the service says it serves the job (it is no spare then).
A placed job's node list stays while it runs (Slurm cannot clear a running job's); it is
cleared the first round the job is pending again, so a later requeue is not pinned to them.

A repair action (the failed GPU healthy again) adds the node to the reservation if gpumeter
made it a spare, then has Slurm reboot it once idle and resume it after (``scontrol reboot ASAP
nextstate=RESUME``): the reboot clears what the failure left in the driver, and slurmd runs the
node's health check (``gpumeter-agent --health-check --drain``) before it takes jobs again.

Nodes are an operator's too: a node drained with a reason that is not gpumeter's (an operator's,
the health check's) is neither drained over nor rebooted nor resumed by gpumeter; a node gpumeter
drained that is found back in service before its repair (resumed by hand) is reported to the
service, which records it and publishes ``slurm.node_resumed_by_hand``; gpumeter does not drain
it again (its health check does, while a GPU is still failed).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import islice
from pathlib import Path
from typing import Any

import httpx

from app.core.console_client import Api, ApiError
from app.core.epoch import from_epoch
from app.slurm.identity import GresLayout
from app.slurm.scheduler import Slurm, SlurmJob, SlurmRefused, SlurmUnavailable
from app.slurm.schemas import (
    OUT_OF_SERVICE,
    PENDING_STATES,
    REASON_PREFIX,
    RUNNING_STATES,
    JobObservation,
    Snapshot,
    ended,
    requeue_settling,
)

log = logging.getLogger(__name__)
SETTLE_S = 3.0  # how long a round waits for a requeued job to finish its last run
SETTLE_POLL_S = 0.2
FULL_EVERY = 30  # rounds: the whole listing again (unchanged jobs' last-seen second moves on)
# Jobs refused for a cause that passes (an account not mapped yet, a node whose agent has not
# reported yet) are sent again each round, this many at most (the ones retried longest ago
# first), so a cluster with many of them costs the service a bounded share of each round.
RETRIES_PER_ROUND = 50


@dataclass(frozen=True)
class AdapterConfig:
    cluster: str
    spare_reservation: str = "gpumeter_spares"
    accounting: bool = True  # read ended and requeued runs from sacct (slurmdbd)
    poll_s: float = 1.0
    # A failover whose job is not running on the spare this long after the failure is given
    # up (below the reservation's time to live, so the spare is released by the abandon).
    resume_deadline_s: float = 90.0
    # The gres.conf slurmd reads: which device file each GRES index is (app.slurm.identity).
    gres_conf: Path | None = None


class Adapter:
    def __init__(self, api: Api, slurm: Slurm, config: AdapterConfig) -> None:
        self.api, self.slurm, self.config = api, slurm, config
        self.rounds = 0
        self.failed_rounds = 0
        # Failover actions whose job was placed: placing again would push its start back. (An
        # adapter restarted mid-way places it once more: two seconds later, nothing else.)
        self._placed: set[int] = set()
        # Each job's (restarts, state, start) last round: accounting is read for the requeued
        # or ended jobs among those that change (a new run's start included: accounting is
        # the record of truth for when the previous run ended, squeue's record only a guess
        # in the moment of a requeue).
        self._seen: dict[int, tuple[int, str, int | None]] = {}
        # What the service was last sent, job by job: later rounds send only what differs.
        self._posted: dict[int, JobObservation] | None = None
        self._resend: set[int] = set()  # jobs the service asked to see again (too new)
        # Jobs refused for a passing cause, the one retried longest ago first (``_retry``).
        self._retrying: dict[int, None] = {}
        self.accounting = config.accounting  # False once sacct says accounting is disabled
        self.gres = GresLayout(config.gres_conf)

    def run(self, stop: threading.Event) -> None:
        """Round after round until ``stop`` is set (SIGTERM); a failed round is logged and the
        next one tries again."""
        while not stop.is_set():
            started = time.monotonic()
            try:
                self.round()
            except (SlurmUnavailable, SlurmRefused, ApiError, httpx.TransportError) as failure:
                self.failed_rounds += 1
                log.warning("slurm_adapter_round_failed", extra={"error": str(failure)})
            self.rounds += 1
            stop.wait(max(0.0, self.config.poll_s - (time.monotonic() - started)))

    def round(self) -> None:
        jobs = {job.job_id: job for job in self.slurm.jobs()}
        actions = self._pending_actions()
        draining = {a["node"] for a in actions if a["kind"] == "failover"}
        for action in actions:
            self._act(action, jobs, draining)
        if actions:
            jobs = {job.job_id: job for job in self.slurm.jobs()}
        self._send_snapshot(list(jobs.values()))
        self._unpin(jobs.values(), {int(a["job_id"]) for a in actions if a["job_id"]})
        self._let_go_stale_holds(jobs.values(), actions)
        layout = self._hold_spares()
        drained = layout.get("drained_nodes", [])  # none from a service older than this adapter
        self._report_resumed_by_hand(drained, {a["node"] for a in actions})

    # --- attribution ------------------------------------------------------------------------

    def _send_snapshot(self, jobs: list[SlurmJob]) -> None:
        """What changed since the last round (the whole listing on the first round and every
        ``FULL_EVERY`` rounds), with accounting's runs for the jobs requeued or ended since;
        then the attributed jobs slurmctld no longer lists, from accounting."""
        changed = [
            job.job_id for job in jobs
            if self._seen.get(job.job_id) != _seen_as(job)
            and (job.restarts > 0 or ended(job.observation))
        ]  # fmt: skip
        accounted = self._accounting(changed)
        observed = self.gres.identify({job.job_id: job.observation for job in jobs})
        observations = {
            job_id: job.model_copy(update={"runs": accounted[job_id].runs})
            if job_id in accounted
            else job
            for job_id, job in observed.items()
        }
        if self._posted is None or self.rounds % FULL_EVERY == 0:
            missing = self._post(list(observations.values()), delta=False)
        else:
            posted = self._posted
            news = [o for job_id, o in observations.items() if posted.get(job_id) != o]
            gone = [job_id for job_id in posted if job_id not in observations]
            missing = self._post(news, delta=True, gone=gone)
        again = self._resend | self._retries(observations)
        self._posted = {i: o for i, o in observations.items() if i not in again}
        self._seen = {job.job_id: _seen_as(job) for job in jobs}
        if missing:
            found = self._accounting(missing)
            forgotten = [job_id for job_id in missing if job_id not in found]
            self._post(list(found.values()), delta=True, forgotten=forgotten)

    def _post(
        self,
        jobs: list[JobObservation],
        *,
        delta: bool,
        gone: list[int] | None = None,
        forgotten: list[int] | None = None,
    ) -> list[int]:
        """Send the snapshot; the attributed jobs it says are missing (to read from accounting,
        or to report as forgotten when accounting does not know them either)."""
        snapshot = Snapshot(
            cluster=self.config.cluster, taken_at=int(time.time()), jobs=jobs, complete=False,
            delta=delta, gone=gone or [], forgotten=forgotten or [],
        )  # fmt: skip
        result = self.api.post("/v1/slurm/snapshots", snapshot.model_dump(mode="json"))
        for problem in result["problems"]:
            log.info("slurm_job_unattributed", extra=problem)
        self._retry([job.job_id for job in jobs], result["problems"])
        self._resend = {int(job_id) for job_id in result.get("too_new", [])}
        return [int(job_id) for job_id in result.get("missing", [])]

    def _retry(self, sent: list[int], problems: list[dict[str, Any]]) -> None:
        """Jobs sent and refused for a cause the service says may pass go to the back of the
        retry queue; jobs sent and not refused (attributed, or refused for good) leave it."""
        for job_id in sent:
            self._retrying.pop(job_id, None)
        for problem in problems:
            if problem.get("retryable"):
                self._retrying[int(problem["job_id"])] = None

    def _retries(self, listed: Mapping[int, JobObservation]) -> set[int]:
        """The jobs to send again next round although unchanged: up to ``RETRIES_PER_ROUND``
        of those refused for a passing cause, the one retried longest ago first (the first
        snapshot after the cause is fixed attributes the job from its start). A job Slurm
        no longer lists leaves the queue."""
        self._retrying = {job_id: None for job_id in self._retrying if job_id in listed}
        return set(islice(self._retrying, RETRIES_PER_ROUND))

    def _accounting(self, job_ids: list[int]) -> dict[int, JobObservation]:
        """The jobs' records in Slurm's accounting; none once it proved disabled (then a job
        slurmctld forgot is ended at the last second seen, and reported)."""
        if not self.accounting or not job_ids:
            return {}
        try:
            return self.slurm.accounting(job_ids)
        except SlurmRefused as refused:
            if "disabled" not in str(refused):
                raise
            log.warning("slurm_accounting_disabled", extra={"error": str(refused)})
            self.accounting = False
            return {}

    # --- actions ----------------------------------------------------------------------------

    def _pending_actions(self) -> list[dict[str, Any]]:
        page = self.api.get("/v1/slurm/actions", cluster=self.config.cluster, limit=100)
        return list(page["items"])

    def _act(self, action: dict[str, Any], jobs: dict[int, SlurmJob], draining: set[str]) -> None:
        try:
            if action["kind"] == "failover":
                self._failover(action, jobs)
            elif action["node"] not in draining:  # its failover first: it drains the node
                self._repair(action)
        except SlurmRefused as refused:
            # Slurm said no (a node or job it does not know): give up this action, saying why.
            log.warning(
                "slurm_action_refused", extra={"action": action["id"], "error": str(refused)}
            )
            self._give_up(action, f"Slurm refused: {refused}")

    def _failover(self, action: dict[str, Any], jobs: dict[int, SlurmJob]) -> None:
        job_id, before = int(action["job_id"]), int(action["restarts_before"])
        job = jobs.get(job_id)
        refusal = None if job is None else job.observation.requeue_refusal()
        if refusal is not None and job is not None and job.restarts == before:
            return self._give_up(action, refusal)
        self._drain(action["node"], action["reason"])
        if action["spare_node"] == action["node"]:
            return self._give_up(action, "the spare is on the failed node; Slurm moves whole nodes")
        if job is None or (
            ended(job.observation) and not requeue_settling(job.observation, before)
        ):
            return self._give_up(action, f"job {job_id} is no longer running in Slurm")
        if job.restarts == before and job.state in RUNNING_STATES:
            # Held first: the survivors are free the moment the requeue ends the run.
            self.slurm.hold_for(self._hold(action), action["nodes_after"], job.user)
            self.slurm.requeue(job_id)
            job = self._settled(job, before)
        if job.restarts > before and job.state in PENDING_STATES:
            if action["id"] not in self._placed:
                self.slurm.place(job_id, action["nodes_after"], self._hold(action), job.user)
                self._placed.add(action["id"])
        elif job.restarts > before and job.state in RUNNING_STATES:
            if action["spare_node"] in job.nodes and job.observation.start_time is not None:
                return self._resumed(action, job.observation.start_time)
            return self._give_up(action, f"job {job_id} runs again on {job.nodes}, not the spare")
        if _age_s(action) > self.config.resume_deadline_s:
            self._give_up(
                action, f"job {job_id} not running on the spare after {_age_s(action):.0f} s"
            )

    def _settled(self, job: SlurmJob, before: int) -> SlurmJob:
        """The job once its requeue has settled (pending, within a second or so), or as it was
        last seen after ``SETTLE_S``: the next round goes on from there."""
        deadline = time.monotonic() + SETTLE_S
        while time.monotonic() <= deadline:
            job = self.slurm.job(job.job_id) or job
            if not requeue_settling(job.observation, before):
                break
            time.sleep(SETTLE_POLL_S)
        return job

    def _resumed(self, action: dict[str, Any], start: int) -> None:
        self._end_hold(self._hold(action), int(action["job_id"]))  # first: done is final
        body = {"resumed_at": from_epoch(start).isoformat()}
        done = self.api.post(f"/v1/slurm/actions/{action['id']}/resumed", body)
        log.info("slurm_action_done", extra={"action": action["id"], "outcome": done["outcome"]})

    def _give_up(self, action: dict[str, Any], reason: str) -> None:
        if action["kind"] != "failover":
            return self._done(action, f"abandoned: {reason}")
        self._end_hold(self._hold(action), int(action["job_id"]))
        body = {"reason": reason[:500]}
        done = self.api.post(f"/v1/slurm/actions/{action['id']}/abandoned", body)
        log.info("slurm_action_done", extra={"action": action["id"], "outcome": done["outcome"]})

    def _drain(self, node: str, reason: str) -> None:
        """Drain the node with gpumeter's reason, unless someone else drained it already: their
        reason stays (and with it, the node stays theirs to bring back)."""
        status = self.slurm.node_status(node)
        if status.drained and not status.reason.startswith(REASON_PREFIX):
            return
        self.slurm.drain(node, reason)

    def _repair(self, action: dict[str, Any]) -> None:
        self._hold_spares()  # a node that became a spare is reserved before it resumes
        node, status = action["node"], self.slurm.node_status(action["node"])
        if not status.drained:
            return self._done(action, f"node {node} is in service already: not rebooted")
        if not status.reason.startswith(REASON_PREFIX):
            return self._done(action, f"node {node} left drained: not gpumeter's ({status.reason})")
        self.slurm.reboot(node, f"{action['reason']}; reboot, then resume"[:200])
        self._done(action, f"node {node} reboots once idle, then resumes (its health check first)")

    def _done(self, action: dict[str, Any], outcome: str) -> None:
        self.api.post(f"/v1/slurm/actions/{action['id']}/done", {"outcome": outcome[:500]})
        log.info("slurm_action_done", extra={"action": action["id"], "outcome": outcome})

    # --- the spare pool ---------------------------------------------------------------------

    def _hold_spares(self) -> dict[str, Any]:
        """The spare reservation holds gpumeter's hot spares in this cluster (a spare an open
        failover is moving a job onto included, until it runs there: the service then no
        longer counts the node a spare); the layout, limited to this cluster."""
        layout: dict[str, Any] = self.api.get("/v1/slurm/layout")
        cluster = self.slurm.nodes()
        wanted = [n for n in cluster if n in set(layout["spare_nodes"])]
        self.slurm.hold_nodes(self.config.spare_reservation, wanted)
        return {key: [n for n in nodes if n in cluster] for key, nodes in layout.items()}

    def _report_resumed_by_hand(self, drained: list[str], acting_on: set[str]) -> None:
        """gpumeter's drained nodes (no action of this round on them) found back in service."""
        for node in drained:
            if node in acting_on:
                continue
            flags = self.slurm.node_status(node).flags
            if flags and not flags & OUT_OF_SERVICE:
                state = "+".join(sorted(flags))
                body = {"cluster": self.config.cluster, "state": state}
                self.api.post(f"/v1/slurm/nodes/{node}/resumed-by-hand", body)
                log.warning("slurm_node_resumed_by_hand", extra={"node": node, "state": state})

    def _hold(self, action: dict[str, Any]) -> str:
        """The reservation that holds a failover's nodes for its job while it is placed."""
        return f"{self._hold_prefix}{action['id']}"

    @property
    def _hold_prefix(self) -> str:
        return f"{self.config.spare_reservation}_failover"

    def _let_go_stale_holds(self, jobs: Iterable[SlurmJob], actions: list[dict[str, Any]]) -> None:
        """A job still in a failover's reservation whose action is done (an adapter stopped
        between the two): the reservation ends, so it holds no node past the failover."""
        open_holds = {self._hold(a) for a in actions if a["kind"] == "failover"}
        for job in jobs:
            held = job.reservation.startswith(self._hold_prefix)
            if held and job.reservation not in open_holds:
                self._end_hold(job.reservation, job.job_id)

    def _end_hold(self, reservation: str, job_id: int) -> None:
        """End a failover's reservation; one Slurm refuses to end is logged and left to
        Slurm (PURGE_COMP ends it once no job is in it), never a reason to abandon."""
        try:
            self.slurm.let_go(reservation, job_id)
        except SlurmRefused as refused:
            log.warning(
                "slurm_hold_kept", extra={"reservation": reservation, "error": str(refused)}
            )

    def _unpin(self, jobs: Iterable[SlurmJob], failing_over: set[int]) -> None:
        """A job a failover placed is pending again (requeued, preempted): its node list goes,
        so it may run wherever its partition lets it."""
        for job in jobs:
            pending = job.state in PENDING_STATES and job.job_id not in failing_over
            if pending and job.placed_by_failover:
                self.slurm.unpin(job.job_id)
                log.info("slurm_job_unpinned", extra={"job_id": job.job_id})


def _seen_as(job: SlurmJob) -> tuple[int, str, int | None]:
    return job.restarts, job.state, job.observation.start_time


def _age_s(action: dict[str, Any]) -> float:
    created = datetime.fromisoformat(action["created_at"])
    return (datetime.now(UTC) - created).total_seconds()
