"""GPU identity: gres.conf's device files name a job's GRES indices, agents' minor numbers name
the devices (``app.slurm.identity``); shard, MPS and MIG jobs are reported, never dropped."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from app.slurm.identity import GresConf, GresLayout, held_gres
from app.slurm.scheduler import parse_job
from app.slurm.schemas import JobObservation, NodeGpus
from tests.metering.conftest import rec
from tests.slurm.conftest import ACCOUNT, SlurmWorld, gpu_of, job

FIXTURES = Path(__file__).parent / "fixtures"


def minors(conf: GresConf, node: str) -> list[int | None] | None:
    found = conf.node(node)
    return None if found is None else [device.minor for device in found.devices]


def test_gres_indices_follow_gres_conf_file_order_not_device_numbers() -> None:
    """As slurmd 22.05 builds its device list (checked against its ``DebugFlags=Gres`` log):
    records in the order written, each File= list expanded in the order written."""
    conf = GresConf("""
# a comment
NodeName=n[1-2] Name=gpu File=/dev/nvidia[2,0,3,1]   # permuted in one list
NodeName=n3 Name=gpu Type=h100 File=/dev/nvidia3
NodeName=n3 Name=gpu Type=h100 File=/dev/nvidia1
NodeName=n3 Name=gpu Type=h100 File=/dev/nvidia0,/dev/nvidia2
NodeName=n4 Name=nic File=/dev/mlx5_0
Name=gpu File=/dev/nvidia7
""")
    assert minors(conf, "n1") == [2, 0, 3, 1, 7]  # a line with no NodeName is every node's
    assert minors(conf, "n2") == [2, 0, 3, 1, 7]
    assert minors(conf, "n3") == [3, 1, 0, 2, 7]
    assert minors(conf, "n4") == [7]


def test_autodetected_gpus_are_ordered_by_minor_number_and_mig_has_no_single_file(
    tmp_path: Path,
) -> None:
    (tmp_path / "nodes.conf").write_text("NodeName=m1 Name=gpu File=/dev/nvidia[3,1]\n")
    conf = GresConf(
        """AutoDetect=nvml
NodeName=a1 AutoDetect=off Name=gpu File=/dev/nvidia[1,0]
NodeName=mig1 Name=gpu Type=1g.10gb MultipleFiles=/dev/nvidia0,/dev/nvidia-caps/nvidia-cap21
NodeName=c1 AutoDetect=off Name=gpu Count=2
Include nodes.conf
""",
        tmp_path,
    )
    detected = conf.node("x9")
    assert detected is not None and (detected.devices, detected.autodetect) == ([], True)
    assert minors(conf, "a1") == [1, 0]  # autodetect off: as written
    assert minors(conf, "m1") == [1, 3]  # autodetect with File=: slurmd sorts by number
    mig = conf.node("mig1")
    assert mig is not None and [(d.minor, d.mig) for d in mig.devices] == [(None, True)]
    assert minors(conf, "c1") == [None, None]  # Count= only: no device file
    assert GresConf("NodeName=z Name=gpu File=/dev/nvidia0").node("y") is None


def held(node: str, indices: list[int]) -> dict[int, JobObservation]:
    return {5: JobObservation.model_validate(job(5, "RUNNING", start=100, nodes={node: indices}))}


def test_the_adapter_names_gres_indices_by_device_and_rereads_a_changed_gres_conf(
    tmp_path: Path,
) -> None:
    path = tmp_path / "gres.conf"
    layout = GresLayout(path)
    assert layout.identify(held("n1", [0])) == held("n1", [0])  # none yet: as Slurm says
    path.write_text("NodeName=n1 Name=gpu File=/dev/nvidia[2,0,3,1]\nNodeName=n9 AutoDetect=nvml\n")
    [n1] = layout.identify(held("n1", [0, 3]))[5].allocation
    assert (n1.gpu_indices, n1.minors, n1.minor_order) == ([0, 3], [2, 1], False)
    [other] = layout.identify(held("n9", [1]))[5].allocation
    assert (other.minors, other.minor_order) == (None, True)
    path.write_text("NodeName=n1 Name=gpu File=/dev/nvidia[0-3]\n")
    os.utime(path, (1, 1))  # another modification time, however fast the rewrite
    [n1] = layout.identify(held("n1", [0, 3]))[5].allocation
    assert n1.minors == [0, 3]
    [beyond] = layout.identify(held("n1", [7]))[5].allocation
    assert beyond.minors is None  # gres.conf does not know index 7: the index is sent


def test_slurm_2205_shard_mps_and_mig_records_are_read_as_such() -> None:
    """Recorded from Debian's slurm-wlm 22.05.8 (``shard(CNT:3)``, ``mps:50(IDX:0)``, a whole
    GPU); job 4 is job 3 with the type AutoDetect=nvml gives a MIG slice."""
    jobs = {j.job_id: j.observation for j in map(parse_job, _recorded())}
    assert [(a.node, a.gpu_indices, a.shared, a.mig) for a in jobs[1].allocation] == [
        ("a1", [], ["shard(CNT:3)"], [])
    ]
    assert [(a.gpu_indices, a.shared) for a in jobs[2].allocation] == [([], ["mps:50(IDX:0)"])]
    assert [(a.gpu_indices, a.shared, a.mig) for a in jobs[3].allocation] == [([0], [], [])]
    assert [(a.gpu_indices, a.mig) for a in jobs[4].allocation] == [([], ["gpu:1g.10gb:1(IDX:4)"])]
    assert held_gres("gpu:h100:2(IDX:0,2),nic:1(IDX:0),mps:25(IDX:1)").gpu_indices == [0, 2]


def _recorded() -> list[dict[str, Any]]:
    return list(json.loads((FIXTURES / "squeue-22.05-shared-gpus.json").read_text())["jobs"])


def test_shard_mps_and_mig_jobs_are_reported_problems_not_dropped(world: SlurmWorld) -> None:
    start = world.t0
    hosts = {"a1": "n1", "a2": "n2"}
    observed = []
    for record in _recorded():
        observation = parse_job(record).observation
        allocation = [a.model_copy(update={"node": hosts[a.node]}) for a in observation.allocation]
        observed.append(
            observation.model_copy(update={"account": ACCOUNT, "start_time": start,
                                           "submit_time": start - 1, "allocation": allocation})
        )  # fmt: skip
    result = world.snapshot(*(o.model_dump(mode="json") for o in observed), at=start + 1)
    problems = {p["job_id"]: (p["reason"], p["detail"]) for p in result["problems"]}
    assert {job_id: reason for job_id, (reason, _) in problems.items()} == {
        1: "shared_gpu_unsupported",
        2: "shared_gpu_unsupported",
        4: "mig_unsupported",
    }
    assert "shard(CNT:3)" in problems[1][1] and "1g.10gb" in problems[4][1]
    assert result["attributed"] == 1
    assert world.assignments(3) == [(gpu_of("n1", 0), start, None)]
    assert {j["job_id"] for j in world.get("/v1/slurm/jobs")["items"]} == {1, 2, 3, 4}


def report_minors(world: SlurmWorld, node: str, minors_by_index: list[int]) -> None:
    """The node's agent, new enough to report minor numbers, reports its GPUs."""
    t = world.t0 - 30
    world.agents[node].post([
        rec(gpu_of(node, i), t, t + 10, device_index=i, minor_number=m)
        for i, m in enumerate(minors_by_index)
    ])  # fmt: skip


def with_minors(
    job_id: int, start: int, node: str, indices: list[int], **named: Any
) -> dict[str, Any]:
    body = job(job_id, "RUNNING", start=start, nodes={node: indices})
    body["allocation"][0].update(named)
    return body


def test_a_job_is_billed_the_gpu_its_device_file_names(world: SlurmWorld) -> None:
    """n1's NVML GPU 0 is /dev/nvidia1 and GPU 1 /dev/nvidia0: GRES index 0, which gres.conf
    says is /dev/nvidia0, is NVML GPU 1 (the index rule billed GPU 0, held by nobody)."""
    start = world.t0
    report_minors(world, "n1", [1, 0])
    body = with_minors(20, start, "n1", [0], minors=[0])
    assert world.snapshot(body, at=start + 1, complete=False)["problems"] == []
    assert world.assignments(20) == [(gpu_of("n1", 1), start, None)]
    # Autodetected (GRES index = rank by minor number): index 1 is the higher minor, GPU 0.
    report_minors(world, "n2", [1, 0])
    body = with_minors(21, start, "n2", [1], minor_order=True)
    assert world.snapshot(body, at=start + 1, complete=False)["problems"] == []
    assert world.assignments(21) == [(gpu_of("n2", 0), start, None)]
    # A device gres.conf names that no GPU of the node reports.
    body = with_minors(22, start, "n1", [1], minors=[5])
    [problem] = world.snapshot(body, at=start + 1, complete=False)["problems"]
    assert problem["reason"] == "unknown_gpu_minor" and "[5]" in problem["detail"]


def test_an_agent_without_minor_numbers_is_billed_by_index_only_where_that_is_sure(
    world: SlurmWorld,
) -> None:
    """The world's agents are older: they report device indices only."""
    start = world.t0
    straight = with_minors(30, start, "n1", [1], minors=[1])
    assert world.snapshot(straight, at=start + 1, complete=False)["problems"] == []
    assert world.assignments(30) == [(gpu_of("n1", 1), start, None)]
    permuted = with_minors(31, start, "n2", [0], minors=[1])
    [problem] = world.snapshot(permuted, at=start + 1, complete=False)["problems"]
    assert problem["reason"] == "gpu_identity_unknown"
    assert "index 0 is device 1" in problem["detail"] and "upgrade" in problem["detail"]
    assert world.job_row(31)["rental_id"] is None  # not billed to a guessed GPU


def test_minors_must_match_the_indices_they_name(world: SlurmWorld) -> None:
    bad = with_minors(40, world.t0, "n1", [0, 1], minors=[0])
    body = world.snapshot(bad, at=world.t0 + 1, status=422)
    assert "1 numbers for 2 GPU indices" in json.dumps(body)
    assert NodeGpus(node="n1", gpu_indices=[0], minors=[3]).minors == [3]
