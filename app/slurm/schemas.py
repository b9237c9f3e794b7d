"""The Slurm adapter's API: account mappings, job snapshots, and the actions it carries out.

A snapshot is what ``squeue --json --states=all`` says about every job at one moment, reduced
to what attribution needs; times are Slurm's own epoch seconds."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any

from pydantic import (
    AwareDatetime,
    Field,
    SerializerFunctionWrapHandler,
    computed_field,
    model_serializer,
    model_validator,
)

from app.core.schemas import Schema
from app.slurm.models import NAME_LENGTH, ActionKind

SlurmName = Annotated[str, Field(min_length=1, max_length=NAME_LENGTH, pattern=r"^[^\s=,]+$")]
EpochSecond = Annotated[int, Field(ge=0, le=2**33)]  # until the year 2242
# Slurm's job states (squeue --json's job_state) that hold their nodes, and those that wait.
RUNNING_STATES = frozenset({"RUNNING", "SUSPENDED", "CONFIGURING", "STOPPED", "RESIZING"})
PENDING_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "SPECIAL_EXIT"})
# Every drain and reboot reason gpumeter gives a node starts so: a drain with another reason is
# someone else's (an operator's, the health check's) and gpumeter leaves it as it is.
REASON_PREFIX = "gpumeter:"
# A node's state flags (scontrol show node) that keep it out of service.
OUT_OF_SERVICE = frozenset({"DRAIN", "DOWN", "FAIL", "REBOOT_REQUESTED", "REBOOT_ISSUED"})
MAX_JOBS = 20_000  # a snapshot's jobs: Slurm's default MaxJobCount is 10,000
MAX_NODES_PER_JOB = 4_096


class AccountMapping(Schema):
    customer_id: uuid.UUID
    plan_id: uuid.UUID


class AccountRead(AccountMapping):
    account: str
    created_at: datetime


GresIndex = Annotated[int, Field(ge=0, le=2**31 - 1)]
GresEntry = Annotated[str, Field(max_length=200)]


class NodeGpus(Schema):
    """The GPUs a job holds on one node: Slurm's GRES indices (``gpu:2(IDX:0-1)``), and how
    they name devices (``app.slurm.identity``)."""

    node: SlurmName
    gpu_indices: list[GresIndex] = Field(max_length=1024)
    minors: list[GresIndex] | None = Field(
        default=None,
        max_length=1024,
        description="the device minor number (/dev/nvidia<minor>) of each GRES index, from "
        "gres.conf's File= list; None: the adapter does not know them",
    )
    minor_order: bool = Field(
        default=False,
        description="Slurm autodetects the node's GPUs (AutoDetect=nvml): GRES index i is the "
        "GPU with the i-th lowest minor number",
    )
    shared: list[GresEntry] = Field(
        default_factory=list, max_length=64, description="shard/mps GRES held (not billed)"
    )
    mig: list[GresEntry] = Field(
        default_factory=list, max_length=64, description="MIG slices held (not billed)"
    )

    @model_serializer(mode="wrap")
    def _named_only(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Without its naming fields where they say nothing: a 10,000-job snapshot is posted
        no longer than before for jobs gres.conf does not name."""
        data: dict[str, Any] = handler(self)
        for name in ("minors", "minor_order", "shared", "mig"):
            if not data.get(name):
                data.pop(name, None)
        return data

    @model_validator(mode="after")
    def _one_minor_per_index(self) -> NodeGpus:
        if self.minors is not None and len(self.minors) != len(self.gpu_indices):
            raise ValueError(
                f"minors has {len(self.minors)} numbers for {len(self.gpu_indices)} GPU indices"
            )
        return self


class AccountedRun(Schema):
    """One run of a job as Slurm's accounting (``sacct --json -D``) keeps it: every requeue
    starts another. The record of truth for when a run began and ended."""

    start: EpochSecond
    end: EpochSecond | None = Field(default=None, description="None while it runs")
    nodes: list[SlurmName] = Field(default_factory=list, max_length=MAX_NODES_PER_JOB)
    state: str = Field(min_length=1, max_length=32)


class JobObservation(Schema):
    job_id: int = Field(ge=1, le=2**63 - 1)
    account: SlurmName
    state: str = Field(min_length=1, max_length=32, description="Slurm's job state, e.g. RUNNING")
    restarts: int = Field(ge=0, le=2**31 - 1, description="Slurm's restart_cnt (requeues)")
    submit_time: EpochSecond = Field(description="a requeue sets it: the previous run's end")
    start_time: EpochSecond | None = None
    end_time: EpochSecond | None = Field(default=None, description="set once the job ended")
    allocation: list[NodeGpus] = Field(default_factory=list, max_length=MAX_NODES_PER_JOB)
    runs: list[AccountedRun] | None = Field(
        default=None,
        max_length=1024,
        description="the job's runs from accounting, oldest first (sent when the job was "
        "requeued, ended or left slurmctld); a run's end is taken from here",
    )
    requeue: bool = Field(default=True, description="Slurm may requeue it (not --no-requeue)")
    batch: bool = Field(default=True, description="a batch job; salloc/srun ones are not")

    def requeue_refusal(self) -> str | None:
        """Why Slurm cannot requeue the job onto a spare, None when it can."""
        if not self.batch:
            return f"job {self.job_id} is interactive (salloc/srun): Slurm cannot requeue it"
        if not self.requeue:
            return f"job {self.job_id} was submitted with --no-requeue: Slurm cannot requeue it"
        return None


def requeue_settling(job: JobObservation, known_restarts: int) -> bool:
    """Requeued and still COMPLETING its last run: its restart count is already the new one,
    its submit time (the run's end) not yet, and its end time is a guess. Wait a round."""
    return job.restarts > known_restarts and job.state == "COMPLETING"


def run_end(job: JobObservation, start: int) -> int | None:
    """Accounting's end of the job's run that began at ``start``, if it has one."""
    return next((r.end for r in job.runs or [] if r.start == start and r.end is not None), None)


def ended(job: JobObservation) -> bool:
    """Done for good (completed, cancelled, failed, timed out, ...), with its end time."""
    return (
        job.end_time is not None
        and job.state not in RUNNING_STATES
        and job.state not in PENDING_STATES
    )


class Snapshot(Schema):
    cluster: SlurmName
    taken_at: EpochSecond
    jobs: list[JobObservation] = Field(max_length=MAX_JOBS)
    complete: bool = Field(
        default=True,
        description="every job Slurm knows is listed: an attributed job missing from it ended "
        "unseen (it aged out of slurmctld) and is ended at the last second it was seen. An "
        "adapter that reads accounting sends false, and the missing jobs' records from "
        "accounting next (``SnapshotResult.missing``)",
    )
    delta: bool = Field(
        default=False,
        description="only the jobs whose record changed since the adapter's last snapshot, "
        "and ``gone``: the jobs slurmctld stopped listing since then",
    )
    gone: list[int] = Field(default_factory=list, max_length=MAX_JOBS)
    forgotten: list[int] = Field(
        default_factory=list,
        max_length=MAX_JOBS,
        description="attributed jobs that neither slurmctld nor accounting knows: ended at the "
        "last second they were seen, and reported",
    )


# Why a job was not attributed, where the cause lies outside the job's own record and may pass
# (the account gets mapped, the node's agent reports its GPUs, the agent is upgraded, the
# budget is raised, the GPU is let go): the adapter sends such a job again until it is
# attributed. The others (shard/MPS/MIG GRES, runs seen ended, a job vanished) stay as they are.
PASSING_PROBLEMS = frozenset({
    "unknown_account", "unknown_node", "unknown_gpu_index", "unknown_gpu_minor",
    "gpu_identity_unknown", "mixed_models", "rental_refused",
})  # fmt: skip


class JobProblem(Schema):
    job_id: int
    reason: str  # unknown_account, unknown_node, unknown_gpu_index, mixed_models, ...
    detail: str

    @computed_field(  # type: ignore[prop-decorator]
        description="the cause may pass (an account mapped, an agent reporting): the adapter "
        "sends the job again each round until it is attributed, from its start"
    )
    @property
    def retryable(self) -> bool:
        return self.reason in PASSING_PROBLEMS


class SnapshotResult(Schema):
    attributed: int  # jobs whose rental changed (began, moved, requeued or ended)
    unchanged: int
    deferred: int  # a failover of the job is under way: attributed once it is resumed
    problems: list[JobProblem]
    # Attributed jobs still open that an incomplete snapshot did not list: the adapter reads
    # them from accounting and sends them (or lists them as forgotten).
    missing: list[int] = Field(default_factory=list)
    # Jobs whose run began in the snapshot's own second: attributed from a later snapshot,
    # so the adapter sends them again.
    too_new: list[int] = Field(default_factory=list)


class ActionRead(Schema):
    id: int
    kind: ActionKind
    cluster: str
    node: str
    failover_id: uuid.UUID | None
    job_id: int | None
    spare_node: str | None
    nodes_after: list[str]
    restarts_before: int | None
    reason: str
    created_at: datetime
    done_at: datetime | None
    outcome: str | None


class ActionResumed(Schema):
    resumed_at: AwareDatetime = Field(description="Slurm's start time of the job's new run")


class ActionDone(Schema):
    outcome: str = Field(min_length=1, max_length=500)


class Layout(Schema):
    """Which Slurm nodes are hot spares (every GPU in the spare pool) and which serve jobs."""

    spare_nodes: list[str]
    worker_nodes: list[str]
    drained_nodes: list[str] = Field(
        default_factory=list,
        description="nodes gpumeter drained for a failed GPU and has not asked to repair: the "
        "adapter reports one it finds back in service (resumed by hand)",
    )


class NodeResumedByHand(Schema):
    cluster: SlurmName
    state: str = Field(min_length=1, max_length=200, description="Slurm's state of the node now")


class JobRead(Schema):
    cluster: str
    job_id: int
    account: str
    rental_id: uuid.UUID | None
    state: str
    restarts: int
    run_start_at: datetime | None
    nodes: list[str]
    last_seen_at: datetime
    ended_at: datetime | None
    problem: str | None
    requeue_refusal: str | None
