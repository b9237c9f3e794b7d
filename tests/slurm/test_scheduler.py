"""Reading Slurm's job records: squeue --json of 22.05 (plain numbers) and of 23.02 and later
(``{"set", "number"}`` objects, ``job_state`` a list), and every form of a GRES index list."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import pytest

from app.core.console_client import Api
from app.slurm.adapter import Adapter, AdapterConfig
from app.slurm.scheduler import Slurm, parse_job


def _record(**fields: Any) -> dict[str, Any]:
    return {
        "job_id": 42, "account": "acme-ml", "job_state": "RUNNING", "restart_cnt": 1,
        "submit_time": 1_796_526_642, "start_time": 1_796_526_645, "end_time": 1_828_062_645,
        "partition": "spares",
        "job_resources": {"allocated_nodes": [{"nodename": "n2"}, {"nodename": "n3"}]},
        "gres_detail": ["gpu:2(IDX:0-1)", "gpu:2(IDX:0-1)"],
        **fields,
    }  # fmt: skip


def test_a_2205_record_reads_as_its_observation() -> None:
    job = parse_job(_record())
    assert job.observation.model_dump() == {
        "job_id": 42, "account": "acme-ml", "state": "RUNNING", "restarts": 1,
        "submit_time": 1_796_526_642, "start_time": 1_796_526_645, "end_time": 1_828_062_645,
        "allocation": [{"node": "n2", "gpu_indices": [0, 1]},
                       {"node": "n3", "gpu_indices": [0, 1]}],
        "runs": None, "requeue": True, "batch": True,
    }  # fmt: skip
    assert (job.partition, job.nodes) == ("spares", ["n2", "n3"])


def test_a_2302_record_with_numbers_in_objects_reads_the_same() -> None:
    newer = _record(
        job_state=["RUNNING"],
        restart_cnt={"set": True, "number": 1},
        submit_time={"set": True, "number": 1_796_526_642},
        start_time={"set": True, "number": 1_796_526_645},
        end_time={"set": True, "number": 1_828_062_645},
    )
    assert parse_job(newer) == parse_job(_record())
    unset = parse_job(_record(start_time={"set": False, "number": 0}, end_time=0))
    assert (unset.observation.start_time, unset.observation.end_time) == (None, None)


@pytest.mark.parametrize(
    ("detail", "indices"),
    [
        ("gpu:2(IDX:0-1)", [0, 1]),
        ("gpu:h100:3(IDX:0,2-3)", [0, 2, 3]),
        ("gpu:h100:1(IDX:5),nic:1(IDX:0)", [5]),
        ("gpu:a100:1(IDX:0),gpu:h100:1(IDX:7)", [0, 7]),
        ("nic:1(IDX:0)", []),
        ("", []),
    ],
)
def test_gres_indices_are_read_from_every_form(detail: str, indices: list[int]) -> None:
    job = parse_job(_record(gres_detail=[detail, ""]))
    held = [a.gpu_indices for a in job.observation.allocation]
    assert held == ([indices] if indices else [])


def test_a_pending_job_holds_nothing() -> None:
    pending = parse_job(_record(job_state="PENDING", job_resources={}, gres_detail=[]))
    assert pending.observation.allocation == [] and pending.nodes == []


FIXTURES = Path(__file__).parent / "fixtures"
VERSIONS = ["22.05", "23.02", "23.11", "24.05"]


class RecordedSlurm(Slurm):
    """Slurm's commands answered from a recorded ``squeue --json`` (22.05's was captured from
    Debian's slurm-wlm 22.05.8; the later ones follow data_parser v0.0.39-v0.0.41: numbers in
    ``{"set", "infinite", "number"}``, ``job_state`` a list, from 23.11 the allocated nodes in
    ``job_resources.nodes.allocation[].name``). Every other command succeeds and is kept."""

    def __init__(self, version: str) -> None:
        super().__init__()
        self.answers = {
            command: path.read_text()
            for command in ("squeue", "sacct")
            if (path := FIXTURES / f"{command}-{version}.json").exists()
        }
        self.commands: list[tuple[str, ...]] = []

    def run(self, *command: str) -> str:
        self.commands.append(command)
        return self.answers.get(command[0], "")


@pytest.mark.parametrize("version", VERSIONS)
def test_one_job_is_read_from_every_versions_full_listing(version: str) -> None:
    """22.05 ignores ``--jobs``: the listing holds every job, and ``job`` picks its own."""
    slurm = RecordedSlurm(version)
    running, cancelled = slurm.job(1), slurm.job(2)
    assert running is not None and cancelled is not None and slurm.job(3) is None
    assert (running.state, running.nodes, running.partition) == ("RUNNING", ["n1", "n2"], "gpu")
    assert (running.user, running.reservation) == ("root", "")  # a failover holds for its user
    assert [a.gpu_indices for a in running.observation.allocation] == [[0, 1], [0, 1]]
    assert (running.observation.start_time, running.observation.restarts) == (1_796_655_493, 0)
    assert (cancelled.state, cancelled.observation.end_time) == ("CANCELLED", 1_796_655_495)
    assert cancelled.observation.allocation == []
    assert slurm.jobs() == RecordedSlurm("22.05").jobs()  # every shape reads the same


def test_requeuing_a_job_beside_an_ended_one_does_not_crash_the_failover() -> None:
    """Two records in slurmctld (job 2 ended within MinJobAge): the failover of job 1 drains
    n1 and requeues job 1, reading its own record among both."""
    slurm = RecordedSlurm("22.05")
    adapter = Adapter(cast(Api, None), slurm, AdapterConfig("hpc"))
    action = {"id": 1, "kind": "failover", "job_id": 1, "restarts_before": 0, "node": "n1",
              "spare_node": "n3", "nodes_after": ["n2", "n3"], "reason": "gpumeter: xid 79",
              "created_at": datetime.now(UTC).isoformat()}  # fmt: skip
    adapter._failover(action, {job.job_id: job for job in slurm.jobs()})
    assert [c[:2] for c in slurm.commands if c[0] == "scontrol"] == [
        ("scontrol", "show"),  # n1 drained by someone else? (not: gpumeter drains it)
        ("scontrol", "update"),
        ("scontrol", "show"),  # the failover's reservation, made already? (this Slurm: yes)
        ("scontrol", "requeue"),
    ]


@pytest.mark.parametrize("version", ["22.05", "23.11"])
def test_accounting_gives_each_asked_jobs_runs(version: str) -> None:
    """Recorded from slurmdbd 22.05 (23.11: ``state.current`` a list): job 1 preempted by a
    higher-priority QOS after 3 s on n1 + n2; job 3 (not asked for) is left out."""
    slurm = RecordedSlurm(version)
    accounted = slurm.accounting([1, 2])
    assert sorted(accounted) == [1, 2]
    preempted = accounted[1]
    assert (preempted.account, preempted.state) == ("acme-ml", "PREEMPTED")
    assert [r.model_dump() for r in preempted.runs or []] == [
        {"start": 1_796_656_258, "end": 1_796_656_261, "nodes": ["n1", "n2"],
         "state": "PREEMPTED"},
    ]  # fmt: skip
    assert (preempted.start_time, preempted.end_time) == (1_796_656_258, 1_796_656_261)
    assert accounted[2].runs and accounted[2].runs[0].nodes == ["n1"]
    assert slurm.accounting([]) == {} and len(slurm.commands) == 1
