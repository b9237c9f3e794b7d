"""Reading Slurm's job records: squeue --json of 22.05 (plain numbers) and of 23.02 and later
(``{"set", "number"}`` objects, ``job_state`` a list), and every form of a GRES index list."""

from __future__ import annotations

from typing import Any

import pytest

from app.slurm.scheduler import parse_job


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
