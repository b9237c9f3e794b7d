"""Slurm through its own commands: ``squeue --json`` for job records, ``scontrol`` to drain,
resume, requeue and place. Every call is bounded by a timeout; a controller that does not answer
is ``SlurmUnavailable`` (the adapter skips that round), a refused command ``SlurmRefused``.

Why the commands and not slurmrestd: they come with every Slurm install (slurmrestd needs its
own daemon, JWT auth and a versioned OpenAPI plugin), and ``squeue --json`` is the same data
parser slurmrestd uses. Its shape changed across releases (22.05's plain numbers became
``{"set", "number"}`` objects in 23.02, ``job_state`` a list): both are read here."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hostlist

from app.slurm.identity import held_gres
from app.slurm.schemas import AccountedRun, JobObservation, NodeGpus
from metering_agent.healthcheck import NodeStatus

DEFAULT_TIMEOUT_S = 10.0
RESTART_DELAY_S = 2
_NODES = re.compile(r"(?:^|\s)Nodes=(\S+)")
PLACED_MARK = "gpumeter-failover-placed:"  # the AdminComment of a job ``place`` pinned


class SlurmUnavailable(RuntimeError):
    """The command did not answer in time, or slurmctld is not reachable."""


class SlurmRefused(RuntimeError):
    """Slurm answered and refused the command (its message says why)."""


@dataclass(frozen=True)
class SlurmJob:
    """A job as ``squeue --json`` shows it, with what the adapter acts on."""

    observation: JobObservation
    partition: str
    qos: str = ""
    admin_comment: str = ""
    user: str = ""  # the job's user name: a reservation that holds nodes for it names them
    reservation: str = ""

    @property
    def placed_by_failover(self) -> bool:
        return self.admin_comment.startswith(PLACED_MARK)

    @property
    def job_id(self) -> int:
        return self.observation.job_id

    @property
    def state(self) -> str:
        return self.observation.state

    @property
    def restarts(self) -> int:
        return self.observation.restarts

    @property
    def nodes(self) -> list[str]:
        return [held.node for held in self.observation.allocation]


class Slurm:
    def __init__(self, conf: Path | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.env = {**os.environ, **({"SLURM_CONF": str(conf)} if conf is not None else {})}
        self.timeout_s = timeout_s

    def run(self, *command: str) -> str:
        try:
            done = subprocess.run(
                command, env=self.env, capture_output=True, text=True, timeout=self.timeout_s
            )
        except subprocess.TimeoutExpired:
            raise SlurmUnavailable(f"{command[0]} did not answer in {self.timeout_s:g} s") from None
        except FileNotFoundError:
            raise SlurmUnavailable(
                f"{command[0]} is not installed (apt-get install slurm-client)"
            ) from None
        if done.returncode != 0:
            message = (done.stderr or done.stdout).strip()
            error = SlurmUnavailable if _unreachable(message) else SlurmRefused
            raise error(f"{' '.join(command[:3])}: {message[:500]}")
        return done.stdout

    # --- jobs -------------------------------------------------------------------------------

    def jobs(self) -> list[SlurmJob]:
        """Every job slurmctld holds (running, pending and, for MinJobAge, ended)."""
        document = json.loads(self.run("squeue", "--json", "--states=all"))
        if errors := document.get("errors"):
            # slurmctld down: exit status 0, no jobs and an error; never "no jobs".
            raise SlurmUnavailable(f"squeue: {json.dumps(errors)[:500]}")
        return [parse_job(job) for job in document.get("jobs", [])]

    def job(self, job_id: int) -> SlurmJob | None:
        """The job's record, None once slurmctld has forgotten it. The records are filtered
        here: 22.05's ``squeue --json`` ignores ``--jobs`` (and every other filter) and lists
        every job it holds, ended ones within MinJobAge included."""
        return next((job for job in self.jobs() if job.job_id == job_id), None)

    def accounting(self, job_ids: Collection[int]) -> dict[int, JobObservation]:
        """The jobs as Slurm's accounting keeps them (``sacct --json -D``: every run, requeued
        ones included, long after slurmctld forgot the job), each with its runs; a job
        accounting does not know is left out. ``SlurmRefused`` when accounting is disabled."""
        if not job_ids:
            return {}
        listed = ",".join(str(i) for i in sorted(job_ids))
        document = json.loads(self.run("sacct", "--json", "-D", "-X", "-a", "--jobs", listed))
        records: dict[int, list[Mapping[str, Any]]] = {}
        for record in document.get("jobs", []):
            job_id = _number(record.get("job_id"))
            if job_id is not None and job_id in job_ids:  # an array's tasks come along
                records.setdefault(job_id, []).append(record)
        return {job_id: accounted_job(found) for job_id, found in records.items()}

    def requeue(self, job_id: int) -> None:
        self.run("scontrol", "requeue", str(job_id))

    def place(self, job_id: int, nodes: list[str], reservation: str, user: str) -> None:
        """Make a pending job run on exactly these nodes, in two seconds, in its own partition
        and QOS, holding them for it meanwhile. A requeue sets its begin time about two
        minutes ahead; not the same second either: a run started in the second its previous
        run's credential was revoked is killed ("Job credential revoked"). The pin is marked
        in the job's AdminComment (which only an operator can set), so ``unpin`` can tell it
        from the customer's own ``-w``.

        The nodes are held by a reservation of their own (``hold_for``), which the job is
        put in: until it runs, no other job may start on them (a spare's node stays in the
        spare reservation too; the survivors, free since the requeue, would be taken too)."""
        self.hold_for(reservation, nodes, user)
        self.run(
            "scontrol", "update", f"JobId={job_id}", f"ReqNodeList={','.join(nodes)}",
            f"StartTime=now+{RESTART_DELAY_S}", f"AdminComment={PLACED_MARK}{','.join(nodes)}",
            f"Reservation={reservation}",
        )  # fmt: skip

    def hold_for(self, reservation: str, nodes: list[str], user: str) -> None:
        """A reservation of these nodes that only ``user``'s jobs naming it may use (a job
        must ask for a reservation to run in it; Slurm lets a job in only if its user is
        the reservation's): OVERLAP, as a spare's node is in the spare reservation still;
        IGNORE_JOBS, as a survivor may still be ending the job's last run; PURGE_COMP, so
        Slurm deletes it once no job is in it for five minutes, should the adapter not.
        Kept if it exists (an adapter restarted mid-way)."""
        if self.reservation_nodes(reservation) is not None:
            return
        self.run(
            "scontrol", "create", "reservation", f"ReservationName={reservation}",
            f"Nodes={','.join(nodes)}", "StartTime=now", "Duration=infinite",
            f"Users={user}", "Flags=OVERLAP,IGNORE_JOBS,PURGE_COMP",
        )  # fmt: skip

    def let_go(self, reservation: str, job_id: int) -> None:
        """End ``hold_for``'s reservation: the job leaves it (running or pending; Slurm keeps
        a reservation any job not ended is in), then it is deleted. Nothing when it is gone
        already."""
        if self.reservation_nodes(reservation) is None:
            return
        try:
            self.run("scontrol", "update", f"JobId={job_id}", "Reservation=")
        except SlurmRefused as refused:
            if "Invalid job id" not in str(refused):  # forgotten by slurmctld: ended
                raise
        self.run("scontrol", "delete", f"ReservationName={reservation}")

    def unpin(self, job_id: int) -> None:
        """Clear the node list ``place`` set, once the job is pending again: Slurm keeps a
        running job's ReqNodeList (an update of it would shrink the job instead)."""
        self.run("scontrol", "update", f"JobId={job_id}", "ReqNodeList=", "AdminComment=")

    # --- nodes and partitions ---------------------------------------------------------------

    def drain(self, node: str, reason: str) -> None:
        self.run("scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}")

    def reboot(self, node: str, reason: str) -> None:
        """Reboot the node as soon as its jobs are done, and put it back in service once it
        has registered again (slurmd's HealthCheckProgram runs first: a node still unfit is
        drained again). Needs ``RebootProgram`` in slurm.conf."""
        self.run("scontrol", "reboot", "ASAP", "nextstate=RESUME", f"reason={reason}", node)

    def node_status(self, node: str) -> NodeStatus:
        """The node's state flags and drain reason, as ``scontrol show node`` has them."""
        return NodeStatus.parse(self.run("scontrol", "show", "node", node))

    def nodes(self) -> list[str]:
        """Every node of the cluster, in slurm.conf's order."""
        return list(dict.fromkeys(self.run("sinfo", "-h", "-N", "-o", "%N").split()))

    def reservation_nodes(self, name: str) -> list[str] | None:
        """The reservation's nodes; None when there is no such reservation."""
        try:
            shown = self.run("scontrol", "show", "reservation", name, "--oneliner")
        except SlurmRefused as refused:
            if "not found" in str(refused):
                return None
            raise
        found = _NODES.search(shown)
        if found is None or found.group(1) == "(null)":
            return []
        return self.run("scontrol", "show", "hostnames", found.group(1)).split()

    def hold_nodes(self, name: str, nodes: list[str]) -> None:
        """Make the reservation hold exactly these nodes (created, changed or deleted): no job
        lands on them unless it names the reservation, which only its users (``root``, the
        operators) may. IGNORE_JOBS: a node still finishing a job can join it."""
        current = self.reservation_nodes(name)
        if current is None and nodes:
            self.run(
                "scontrol", "create", "reservation", f"ReservationName={name}",
                f"Nodes={','.join(nodes)}", "StartTime=now", "Duration=infinite", "Users=root",
                "Flags=IGNORE_JOBS",
            )  # fmt: skip
        elif current is not None and not nodes:
            self.run("scontrol", "delete", f"ReservationName={name}")
        elif current is not None and set(current) != set(nodes):
            self.run("scontrol", "update", f"ReservationName={name}", f"Nodes={','.join(nodes)}")


def _unreachable(message: str) -> bool:
    return any(
        sign in message
        for sign in ("Unable to contact slurm controller", "Socket timed out", "Connection refused")
    )


def parse_job(job: Mapping[str, Any]) -> SlurmJob:
    state = job.get("job_state")
    state = state[0] if isinstance(state, list) and state else state
    observation = JobObservation(
        job_id=int(_number(job["job_id"]) or 0),
        account=str(job.get("account") or "(none)"),
        state=str(state or "UNKNOWN"),
        restarts=int(_number(job.get("restart_cnt")) or 0),
        submit_time=int(_number(job.get("submit_time")) or 0),
        start_time=_number(job.get("start_time")) or None,
        end_time=_number(job.get("end_time")) or None,
        allocation=allocation(job),
        requeue=bool(job.get("requeue", True)),
        batch=bool(job.get("batch_flag", True)),
    )
    return SlurmJob(
        observation,
        partition=str(job.get("partition") or ""),
        qos=str(job.get("qos") or ""),
        admin_comment=str(job.get("admin_comment") or ""),
        user=str(job.get("user_name") or ""),
        reservation=str(job.get("resv_name") or ""),
    )


def accounted_job(records: list[Mapping[str, Any]]) -> JobObservation:
    """One job from its accounting records (one per run with ``-D``): as its last run left
    it, with every run that started."""
    runs = sorted((run for r in records if (run := accounted_run(r)) is not None), key=_start)
    last = max(records, key=lambda r: _number(_time(r, "submission")) or 0)
    return JobObservation(
        job_id=int(_number(last["job_id"]) or 0),
        account=str(last.get("account") or "(none)"),
        state=_state(last),
        restarts=max(len(runs) - 1, 0),
        submit_time=_number(_time(last, "submission")) or 0,
        start_time=runs[-1].start if runs else None,
        end_time=runs[-1].end if runs else None,
        runs=runs,
    )


def accounted_run(record: Mapping[str, Any]) -> AccountedRun | None:
    """A run of a job from its accounting record; None for a record of a job that never ran
    (cancelled while pending)."""
    start = _number(_time(record, "start"))
    if not start:
        return None
    nodes = str(record.get("nodes") or "")
    return AccountedRun(
        start=start,
        end=_number(_time(record, "end")) or None,
        nodes=[] if nodes in ("", "None assigned") else hostlist.expand_hostlist(nodes),
        state=_state(record),
    )


def _time(record: Mapping[str, Any], which: str) -> Any:
    return (record.get("time") or {}).get(which)


def _start(run: AccountedRun) -> int:
    return run.start


def _state(record: Mapping[str, Any]) -> str:
    """sacct's ``state.current``: a string in 22.05, a list from 23.02."""
    current = (record.get("state") or {}).get("current")
    current = current[0] if isinstance(current, list) and current else current
    return str(current or "UNKNOWN")[:32]


def allocation(job: Mapping[str, Any]) -> list[NodeGpus]:
    """Node by node, the GPU indices the job holds: ``gres_detail`` lists one entry per
    allocated node, in the order of the job's allocated nodes."""
    nodes = allocated_nodes(job.get("job_resources") or {})
    details = job.get("gres_detail") or []
    held = []
    for node, detail in zip(nodes, details, strict=False):
        gres = held_gres(str(detail))
        if gres.gpu_indices or gres.shared or gres.mig:  # shares and slices: reported
            held.append(NodeGpus(node=node, gpu_indices=gres.gpu_indices, shared=gres.shared,
                                 mig=gres.mig))  # fmt: skip
    return held


def allocated_nodes(resources: Mapping[str, Any]) -> list[str]:
    """The job's nodes in allocation order: ``allocated_nodes[].nodename`` up to 23.02,
    ``nodes.allocation[].name`` from 23.11 (where ``nodes`` stopped being the node list)."""
    nodes = resources.get("nodes")
    if isinstance(nodes, Mapping):
        return [str(n["name"]) for n in nodes.get("allocation") or [] if "name" in n]
    return [str(n["nodename"]) for n in resources.get("allocated_nodes") or [] if "nodename" in n]


def _number(value: Any) -> int | None:
    """22.05 gives a plain number; 23.02 on an object ``{"set": bool, "number": n}``."""
    if isinstance(value, dict):
        return int(value["number"]) if value.get("set") else None
    return None if value is None else int(value)
