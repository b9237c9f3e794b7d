"""The Slurm adapter: a process beside slurmctld that keeps gpumeter and Slurm in step.

Each round (``poll_s``, default 1 s) it reads every job (``squeue --json --states=all``),
carries out gpumeter's pending actions, sends the jobs as a snapshot (attribution), and keeps
the worker partition's nodes in line with gpumeter's spare pool. A round that cannot read
Slurm sends nothing (an empty snapshot would end every job), and is retried the next round.

A failover action, step by step, each step idempotent (an adapter restarted, or a slurmctld
that went away mid-way, repeats nothing and skips nothing):
1. drain the failed node, its reason gpumeter's evidence;
2. requeue the job, unless Slurm's restart count shows it was requeued since the failure;
3. place the pending job on the survivors plus the spare's node, in the spare partition (which
   holds every node; the worker partition excludes the spares), starting now;
4. once it runs there, report ``resumed`` at Slurm's start time, or ``abandoned`` with the
   reason when it cannot (the job ended, ran elsewhere, or did not run by the deadline).

A repair action takes the node out of the worker partition if gpumeter made it a spare, then
resumes it.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx

from app.core.console_client import Api, ApiError
from app.core.epoch import from_epoch
from app.slurm.scheduler import Slurm, SlurmJob, SlurmRefused, SlurmUnavailable
from app.slurm.schemas import (
    PENDING_STATES,
    RUNNING_STATES,
    Snapshot,
    ended,
    requeue_settling,
)

log = logging.getLogger(__name__)
SETTLE_S = 3.0  # how long a round waits for a requeued job to finish its last run
SETTLE_POLL_S = 0.2


@dataclass(frozen=True)
class AdapterConfig:
    cluster: str
    worker_partition: str
    spare_partition: str
    poll_s: float = 1.0
    # A failover whose job is not running on the spare this long after the failure is given
    # up (below the reservation's time to live, so the spare is released by the abandon).
    resume_deadline_s: float = 90.0


class Adapter:
    def __init__(self, api: Api, slurm: Slurm, config: AdapterConfig) -> None:
        self.api, self.slurm, self.config = api, slurm, config
        self.rounds = 0
        self.failed_rounds = 0
        # Failover actions whose job was placed: placing again would push its start back. (An
        # adapter restarted mid-way places it once more: two seconds later, nothing else.)
        self._placed: set[int] = set()

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
        self._sync_partitions()

    # --- attribution ------------------------------------------------------------------------

    def _send_snapshot(self, jobs: list[SlurmJob]) -> None:
        snapshot = Snapshot(
            cluster=self.config.cluster,
            taken_at=int(time.time()),
            jobs=[job.observation for job in jobs],
        )
        result = self.api.post("/v1/slurm/snapshots", snapshot.model_dump(mode="json"))
        for problem in result["problems"]:
            log.info("slurm_job_unattributed", extra=problem)

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
        self.slurm.drain(action["node"], action["reason"])
        job = jobs.get(job_id)
        if action["spare_node"] == action["node"]:
            return self._give_up(action, "the spare is on the failed node; Slurm moves whole nodes")
        if job is None or (
            ended(job.observation) and not requeue_settling(job.observation, before)
        ):
            return self._give_up(action, f"job {job_id} is no longer running in Slurm")
        if job.restarts == before and job.state in RUNNING_STATES:
            self.slurm.requeue(job_id)
            job = self._settled(job, before)
        if job.restarts > before and job.state in PENDING_STATES:
            if action["id"] not in self._placed:
                self.slurm.place(job_id, self.config.spare_partition, action["nodes_after"])
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
        body = {"resumed_at": from_epoch(start).isoformat()}
        done = self.api.post(f"/v1/slurm/actions/{action['id']}/resumed", body)
        log.info("slurm_action_done", extra={"action": action["id"], "outcome": done["outcome"]})

    def _give_up(self, action: dict[str, Any], reason: str) -> None:
        if action["kind"] != "failover":
            return self._done(action, f"abandoned: {reason}")
        body = {"reason": reason[:500]}
        done = self.api.post(f"/v1/slurm/actions/{action['id']}/abandoned", body)
        log.info("slurm_action_done", extra={"action": action["id"], "outcome": done["outcome"]})

    def _repair(self, action: dict[str, Any]) -> None:
        self._sync_partitions()  # a node that became a spare leaves the workers before it resumes
        self.slurm.resume(action["node"])
        self._done(action, f"node {action['node']} resumed")

    def _done(self, action: dict[str, Any], outcome: str) -> None:
        self.api.post(f"/v1/slurm/actions/{action['id']}/done", {"outcome": outcome[:500]})
        log.info("slurm_action_done", extra={"action": action["id"], "outcome": outcome})

    # --- the spare pool ---------------------------------------------------------------------

    def _sync_partitions(self) -> None:
        """The worker partition holds gpumeter's non-spare nodes and none of its spares; the
        spare partition (every node) is left as configured."""
        every = self.slurm.partition_nodes(self.config.spare_partition)
        if not every:
            return
        layout = self.api.get("/v1/slurm/layout")
        current = self.slurm.partition_nodes(self.config.worker_partition)
        wanted = (set(current) | set(layout["worker_nodes"])) - set(layout["spare_nodes"])
        wanted &= set(every)  # gpumeter's nodes that are not in this cluster stay out
        if wanted and wanted != set(current):
            ordered = [node for node in every if node in wanted]
            self.slurm.set_partition_nodes(self.config.worker_partition, ordered)
            log.info("slurm_workers_changed", extra={"before": current, "after": ordered})


def _age_s(action: dict[str, Any]) -> float:
    created = datetime.fromisoformat(action["created_at"])
    return (datetime.now(UTC) - created).total_seconds()
