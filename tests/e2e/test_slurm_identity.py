"""GPU identity on a real Slurm whose gres.conf numbers GPUs in another order than NVML.

Node n1 has four GPUs. NVML numbers them 0..3 and its agent reports each one's device minor
number: NVML index i is /dev/nvidia<MINORS[i]>. gres.conf lists n1's device files as
``File=.../gpu[2,0,3,1]``, so Slurm's GRES index 0 is device 2, index 1 device 0, and so on.
A job's GPUs must be billed as the device files Slurm gave it (which slurmd itself logs in
GRES index order), not as the NVML GPUs with the same numbers: before the adapter read
gres.conf, job 1's GRES index 0 was billed as NVML GPU 0, a GPU another customer may hold.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.core.console_client import Api
from app.core.processes import stop_child
from app.demo.slurm_cluster import LocalSlurm
from metering_agent.nvml.simulated import DEFAULT_MODEL
from tests.e2e.conftest import BIN, Fleet
from tests.e2e.test_slurm import ACCOUNT, CLUSTER, PRICE, assignments, attributed, gpu, job_record
from tests.harness import running_slurm, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("slurm")]

GRES_ORDER = [2, 0, 3, 1]  # n1's device files, in gres.conf's File= order (GRES index order)
MINORS = [1, 3, 0, 2]  # NVML index i is /dev/nvidia<MINORS[i]>


def billed_as(minor: int) -> str:
    """The UUID of n1's GPU whose device is ``minor``."""
    return gpu("n1", MINORS.index(minor))


@pytest.fixture
def slurm(tmp_path: Path) -> Iterator[LocalSlurm]:
    with running_slurm(tmp_path, ["n1"], [], gpus=4, gres_order={"n1": GRES_ORDER}) as cluster:
        yield cluster


@pytest.fixture
def api(fleet: Fleet, slurm: LocalSlurm) -> Iterator[Api]:
    """n1 with its agent (permuted minor numbers), a per-second plan, the account mapped,
    and the adapter, which finds gres.conf beside slurm.conf as on a provider's controller."""
    api = Api(fleet.service.url, fleet.admin)
    created = api.post("/v1/nodes", {"hostname": "n1", "datacenter": "e2e"})
    for i in range(4):
        api.post("/v1/gpus", {"uuid": gpu("n1", i), "node_id": created["node"]["id"],
                              "model": DEFAULT_MODEL, "pool": "rentable"})  # fmt: skip
    prices = [{"gpu_model": DEFAULT_MODEL, "price_per_hour": PRICE,
               "effective_from": "2026-01-01T00:00:00Z"}]  # fmt: skip
    plan = api.post("/v1/plans", {"name": "per second", "prices": prices})
    customer = api.post("/v1/customers", {"name": "Acme AI", "currency": "USD"})
    mapping = {"customer_id": customer["id"], "plan_id": plan["id"]}
    api.call("PUT", f"/v1/slurm/accounts/{ACCOUNT}", mapping)
    key = api.post("/v1/keys/scheduler", {"name": "gpumeter-slurm"})["key"]
    fleet.agent("n1", created["token"]["key"], "--simulate", "4",
                "--simulate-minors", ",".join(map(str, MINORS)))  # fmt: skip
    with (fleet.tmp / "adapter.log").open("wb") as log:
        adapter = subprocess.Popen(
            [str(BIN / "gpumeter-slurm"), "--server", fleet.service.url, "--token", key,
             "--cluster", CLUSTER, "--slurm-conf", str(slurm.conf), "--poll-interval", "0.5"],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        yield api
    finally:
        assert stop_child(adapter, "gpumeter-slurm") == 0
        api.close()


def test_a_permuted_gres_conf_bills_the_gpus_the_job_got(
    slurm: LocalSlurm, api: Api, fleet: Fleet
) -> None:
    one = slurm.submit(ACCOUNT, nodes=1, gpus=1)
    wait_for(lambda: job_record(slurm, one).state == "RUNNING", "job 1 running", 30)
    two = slurm.submit(ACCOUNT, nodes=1, gpus=2)
    wait_for(lambda: attributed(api, one) and attributed(api, two), "both jobs attributed", 30)

    held = {j: job_record(slurm, j).observation.allocation[0].gpu_indices for j in (one, two)}
    assert held == {one: [0], two: [1, 2]}  # Slurm's GRES indices
    if slurm.character_devices:  # this host let us make them: slurmd logs what it loaded
        assert slurm.device_order("n1") == GRES_ORDER  # slurmd's own word, by GRES index
    for job_id, indices in held.items():
        rental = attributed(api, job_id)["rental_id"]  # type: ignore[index]
        start = job_record(slurm, job_id).observation.start_time
        expected = sorted((billed_as(GRES_ORDER[i]), start, None) for i in indices)
        assert assignments(api, rental) == expected
    # Job 1 holds device 2: NVML GPU 3, not NVML GPU 0 (GRES index 0 read as an NVML index).
    assert billed_as(GRES_ORDER[0]) == gpu("n1", 3)
    assert [j["problem"] for j in api.get("/v1/slurm/jobs", cluster=CLUSTER)["items"]] == [
        None,
        None,
    ]
