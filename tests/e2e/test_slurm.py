"""The failure loop on a real Slurm: slurmctld and three ``slurmd -N`` (n1, n2 workers, n3 the
hot spare) on this host, a real service and worker, real agents simulating each node's two GPUs,
and the real adapter (``gpumeter-slurm``). A two-node job runs on n1 + n2, another tenant's
job waits for a node; n1's GPU 0 falls off the bus (XID 79); the adapter drains n1 with the
evidence as its reason and requeues the job onto n2 + n3, which the waiting job cannot take
meanwhile; the invoice credits exactly resumed - failed seconds; the rental's assignments
are what Slurm says ran where, to the second. The second test restarts slurmctld while the
failover is under way: nothing is lost or done twice.

Slurm comes from ``apt-get install slurm-wlm`` (``.ci/run`` installs it); without it these
tests skip, except in CI, where they fail."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from app.core.console_client import Api
from app.core.epoch import epoch, from_epoch
from app.core.processes import stop_child
from app.demo.slurm_cluster import SPARE_RESERVATION, LocalSlurm
from app.slurm.scheduler import Slurm, SlurmJob
from metering_agent.nvml.simulated import DEFAULT_MODEL, sim_uuid
from tests.e2e.conftest import BIN, Fleet
from tests.harness import running_slurm, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("slurm")]

CLUSTER = "e2e"
ACCOUNT = "acme-ml"
PRICE = "36.00"  # one cent a second: credited cents = credited seconds
WORKERS, SPARES = ["n1", "n2"], ["n3"]
FAULT_AT_S = 15  # after the agent starts: the job is attributed by then
RECOVER_AT_S = 40
LOOP_TIMEOUT_S = 90


@pytest.fixture
def slurm(tmp_path: Path) -> Iterator[LocalSlurm]:
    with running_slurm(tmp_path, WORKERS, SPARES) as cluster:
        yield cluster


@dataclass(frozen=True)
class Provider:
    api: Api
    customer: str
    tokens: dict[str, str]
    scheduler_key: str  # the adapter's: snapshots and failover outcomes only


@pytest.fixture
def provider(fleet: Fleet) -> Iterator[Provider]:
    """Nodes n1..n3 (n3's GPUs hot spares), a per-second plan, Acme AI and its account."""
    api = Api(fleet.service.url, fleet.admin)
    tokens = {}
    for node in WORKERS + SPARES:
        created = api.post("/v1/nodes", {"hostname": node, "datacenter": "e2e",
                                         "topology_group": "nvl-1"})  # fmt: skip
        tokens[node] = created["token"]["key"]
        pool = "spare" if node in SPARES else "rentable"
        for i in range(2):
            api.post("/v1/gpus", {"uuid": gpu(node, i), "node_id": created["node"]["id"],
                                  "model": DEFAULT_MODEL, "pool": pool})  # fmt: skip
    prices = [{"gpu_model": DEFAULT_MODEL, "price_per_hour": PRICE,
               "effective_from": "2026-01-01T00:00:00Z"}]  # fmt: skip
    plan = api.post("/v1/plans", {"name": "per second", "prices": prices})
    customer = api.post("/v1/customers", {"name": "Acme AI", "currency": "USD"})
    mapping = {"customer_id": customer["id"], "plan_id": plan["id"]}
    api.call("PUT", f"/v1/slurm/accounts/{ACCOUNT}", mapping)
    scheduler_key = api.post("/v1/keys/scheduler", {"name": "gpumeter-slurm"})["key"]
    yield Provider(api, customer["id"], tokens, scheduler_key)
    api.close()


def gpu(node: str, index: int) -> str:
    return sim_uuid(node, index, node)


def start_agents(fleet: Fleet, provider: Provider) -> None:
    faults = [{"at": FAULT_AT_S, "gpu": 0, "fault": "xid", "xid": 79},
              {"at": RECOVER_AT_S, "gpu": 0, "fault": "recover"}]  # fmt: skip
    for node, token in provider.tokens.items():
        fleet.agent(node, token, "--simulate", "2", faults=faults if node == "n1" else None)


@pytest.fixture
def adapter(fleet: Fleet, slurm: LocalSlurm, provider: Provider) -> Iterator[subprocess.Popen]:
    with (fleet.tmp / "adapter.log").open("wb") as log:
        process = subprocess.Popen(
            [str(BIN / "gpumeter-slurm"), "--server", fleet.service.url,
             "--token", provider.scheduler_key, "--cluster", CLUSTER,
             "--slurm-conf", str(slurm.conf), "--poll-interval", "0.5"],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    yield process
    assert stop_child(process, "gpumeter-slurm") == 0  # SIGTERM: a clean stop


def job_record(slurm: LocalSlurm, job_id: int) -> SlurmJob:
    job = Slurm(slurm.conf).job(job_id)
    assert job is not None, f"Slurm has no record of job {job_id}"
    return job


def attributed(api: Api, job_id: int) -> dict[str, Any] | None:
    rows = api.get("/v1/slurm/jobs", cluster=CLUSTER)["items"]
    row = next((r for r in rows if r["job_id"] == job_id), None)
    return row if row is not None and row["rental_id"] else None


def failover_in(api: Api, state: str) -> dict[str, Any] | None:
    items = api.get("/v1/failovers", state=state)["items"]
    return items[0] if items else None


def assignments(api: Api, rental_id: str) -> list[tuple[str, int | None, int | None]]:
    rental = api.get(f"/v1/rentals/{rental_id}")
    return sorted(
        (a["gpu_uuid"], _s(a["start_at"]), _s(a["end_at"])) for a in rental["assignments"]
    )


def _s(moment: str | None) -> int | None:
    return None if moment is None else epoch(datetime.fromisoformat(moment))


def run_the_failure_loop(
    fleet: Fleet, slurm: LocalSlurm, provider: Provider, *, restart_controller: bool
) -> None:
    api = provider.api
    start_agents(fleet, provider)
    job_id = slurm.submit(ACCOUNT, nodes=2)
    wait_for(lambda: attributed(api, job_id), "the job attributed to a rental", timeout_s=30)
    first = job_record(slurm, job_id)
    assert first.nodes == ["n1", "n2"] and first.restarts == 0
    assert first.observation.start_time is not None
    rental = attributed(api, job_id)["rental_id"]  # type: ignore[index]
    # Another tenant's job waits for a node: n2 frees at the requeue, n3 is the spare.
    waiting = slurm.submit("beta-lab", nodes=1)
    if restart_controller:
        slurm.stop_controller()  # down before the GPU fails: the adapter must ride it out
        wait_for(lambda: failover_in(api, "requested"), "the failover requested", LOOP_TIMEOUT_S)
        [action] = api.get("/v1/slurm/actions", cluster=CLUSTER)["items"]
        assert action["done_at"] is None  # nothing could be done in Slurm meanwhile
        slurm.start_controller()
    wait_for(lambda: failover_in(api, "resumed"), "the failover resumed", LOOP_TIMEOUT_S)
    failover = failover_in(api, "resumed")
    assert failover is not None

    # Slurm: n1 drained with gpumeter's evidence, the job requeued once and running on n2 + n3.
    assert slurm.node_reason("n1").startswith(f"gpumeter: GPU 0 ({gpu('n1', 0)}) xid 79")
    rerun = job_record(slurm, job_id)
    assert (rerun.state, rerun.restarts, rerun.nodes) == ("RUNNING", 1, ["n2", "n3"])
    assert rerun.partition == "gpu" and rerun.placed_by_failover  # its own partition
    assert rerun.observation.start_time is not None
    failed_s, resumed_s = _s(failover["failed_at"]), _s(failover["resumed_at"])
    assert resumed_s == rerun.observation.start_time
    assert failover["spare_gpu_uuid"] in (gpu("n3", 0), gpu("n3", 1))
    # The nodes were held for the job from its requeue until it ran there: the waiting job
    # took neither, and the hold ended with the failover.
    bystander = job_record(slurm, waiting)
    assert (bystander.state, bystander.restarts, bystander.nodes) == ("PENDING", 0, [])
    assert "_failover" not in slurm.run("scontrol", "show", "reservation", "--oneliner")
    assert rerun.reservation == ""
    slurm.run("scancel", str(waiting))

    # The repaired GPU: n1 is not resumed at once but rebooted once idle, to come back after
    # (nextstate=RESUME; slurmd's health check runs first), a hot spare now (the site had none
    # left), held. A slurmd -N node cannot reboot: its RebootProgram records that slurmd was
    # asked, and which node Slurm had issued the reboot to, with its reason, then resumes it
    # as the rebooted node's slurmd would.
    wait_for(lambda: slurm.rebooted(), "n1's reboot issued and done", LOOP_TIMEOUT_S)
    assert slurm.reboots() == 1
    [rebooted] = slurm.rebooted()
    assert rebooted.startswith(  # Slurm adds " : reboot issued"
        f"n1 gpumeter: GPU {gpu('n1', 0)} healthy again; reboot, then resume"
    )
    wait_for(lambda: "DRAIN" not in slurm.node_state("n1"), "n1 back in service", 30)
    wait_for(lambda: slurm.reserved_nodes() == ["n1"], "n1 a spare, held by the reservation", 30)
    pools = {g["uuid"]: g["pool"] for g in api.get("/v1/gpus", limit=100)["items"]}
    assert [pools[gpu("n1", i)] for i in (0, 1)] == ["spare", "spare"]

    # The job ends: the rental ends at Slurm's end second.
    slurm.run("scancel", str(job_id))
    wait_for(lambda: attributed(api, job_id)["ended_at"], "the job's end attributed", 30)  # type: ignore[index]
    done = job_record(slurm, job_id)
    end_s = done.observation.end_time
    assert end_s is not None
    cut = rerun.observation.submit_time  # the requeue's second: the first run's end
    start_s, start2 = first.observation.start_time, rerun.observation.start_time
    spare = failover["spare_gpu_uuid"]
    [other] = {gpu("n3", 0), gpu("n3", 1)} - {spare}
    assert assignments(api, rental) == sorted([
        (gpu("n1", 0), start_s, failed_s),  # the failed GPU, to its first failed second
        (gpu("n1", 1), start_s, cut),
        (gpu("n2", 0), start_s, cut),
        (gpu("n2", 1), start_s, cut),
        (spare, start2, end_s),  # the failover's migration, from the resumption
        (other, start2, end_s),
        (gpu("n2", 0), start2, end_s),
        (gpu("n2", 1), start2, end_s),
    ])  # fmt: skip
    [migration] = api.get(f"/v1/rentals/{rental}")["migrations"]
    assert (_s(migration["failed_at"]), _s(migration["resumed_at"])) == (failed_s, resumed_s)
    assert api.get("/v1/slurm/actions", cluster=CLUSTER)["items"] == []  # all done

    # The invoice credits exactly the migration window of the failed GPU, in cents.
    api.post("/v1/invoices/runs", {"period": f"{from_epoch(end_s):%Y-%m}"})
    (listed,) = api.get("/v1/invoices", customer_id=provider.customer)["items"]
    invoice = api.get(f"/v1/invoices/{listed['id']}")
    credits = [line for line in invoice["lines"] if line["kind"].endswith("_credit")]
    down = [line for line in credits if line["kind"] != "stall_credit"]
    assert failed_s is not None and resumed_s is not None
    assert sum(line["seconds"] for line in down) == resumed_s - failed_s
    assert -sum(Decimal(line["amount"]) for line in down) == Decimal(resumed_s - failed_s) / 100
    assert {line["gpu_uuid"] for line in down} == {gpu("n1", 0)}
    # The job stalled with its GPU: its other three are credited from the failure until Slurm
    # requeued it (their first run's end), not billed for a job that could not run.
    stalled: dict[str, int] = {}
    for line in (line for line in credits if line not in down):
        stalled[line["gpu_uuid"]] = stalled.get(line["gpu_uuid"], 0) + line["seconds"]
    others = (gpu("n1", 1), gpu("n2", 0), gpu("n2", 1))
    assert stalled == {g: cut - failed_s for g in others if cut > failed_s}


def test_a_gpu_failure_fails_the_job_over_to_the_spare_through_slurm(
    fleet: Fleet, slurm: LocalSlurm, provider: Provider, adapter: subprocess.Popen
) -> None:
    run_the_failure_loop(fleet, slurm, provider, restart_controller=False)


def test_slurmctld_restarted_mid_failover_loses_and_doubles_nothing(
    fleet: Fleet, slurm: LocalSlurm, provider: Provider, adapter: subprocess.Popen
) -> None:
    run_the_failure_loop(fleet, slurm, provider, restart_controller=True)
    assert adapter.poll() is None  # the adapter rode the outage out


def test_the_hot_spare_is_held_from_every_customer_job(slurm: LocalSlurm) -> None:
    """n3 is gpumeter's hot spare, held by the reservation: a customer's job that needs it
    waits, naming it (``-w n3``) does not help, there is no spare partition to name, and a
    job that fits the workers runs on them. The adapter's ``hold_nodes`` keeps the reservation
    as gpumeter's pools say (created, moved, deleted)."""
    everything = slurm.submit("beta-lab", nodes=3)
    named = slurm.submit("beta-lab", nodes=1, extra=("--nodelist=n3",))
    with pytest.raises(RuntimeError, match="invalid partition"):
        slurm.submit("beta-lab", nodes=1, extra=("--partition=spares",))
    fits = slurm.submit("acme-ml", nodes=2)
    wait_for(lambda: job_record(slurm, fits).state == "RUNNING", "the 2-node job running", 30)
    assert job_record(slurm, fits).nodes == ["n1", "n2"]
    for waiting in (everything, named):
        record = job_record(slurm, waiting)
        assert (record.state, record.observation.start_time) == ("PENDING", None)
    assert "reserved" in slurm.run("squeue", "-h", "-j", str(named), "-o", "%r")

    scheduler = Slurm(slurm.conf)
    scheduler.hold_nodes(SPARE_RESERVATION, ["n2", "n3"])  # n2 is busy: IGNORE_JOBS
    assert slurm.reserved_nodes() == ["n2", "n3"]
    scheduler.hold_nodes(SPARE_RESERVATION, [])
    assert scheduler.reservation_nodes(SPARE_RESERVATION) is None
    wait_for(lambda: job_record(slurm, named).state == "RUNNING", "n3 free for -w n3", 30)
    scheduler.hold_nodes(SPARE_RESERVATION, ["n3"])  # created again, around the running job
    assert slurm.reserved_nodes() == ["n3"]


def _agent_with_a_latched_failure(spool: Path, node: str) -> None:
    """The real agent runs three seconds on ``node``'s two simulated GPUs; GPU 0 falls off the
    bus at once (XID 79): a hardware failure, latched in the spool's latch.json."""
    faults = spool.parent / f"faults-{node}.json"
    faults.write_text(json.dumps([{"at": 0, "gpu": 0, "fault": "xid", "xid": 79}]))
    subprocess.run(
        [str(BIN / "gpumeter-agent"), "--server", "http://127.0.0.1:9", "--token", "t",
         "--spool-dir", str(spool), "--node-name", node, "--uuid-prefix", node,
         "--simulate", "2", "--faults", str(faults), "--duration", "3",
         "--shutdown-upload-timeout", "0"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    assert (spool / "latch.json").exists()


def _health_check(slurm: LocalSlurm, spool: Path, node: str) -> tuple[int, dict[str, Any]]:
    """What slurmd's HealthCheckProgram runs on ``node`` (slurmd names the node)."""
    done = subprocess.run(
        [str(BIN / "gpumeter-agent"), "--health-check", "--drain", "--spool-dir", str(spool),
         "--simulate", "2", "--node-name", node, "--uuid-prefix", node],
        env={**slurm.env, "SLURMD_NODENAME": node}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    return done.returncode, json.loads(done.stdout)


def test_the_health_check_drains_a_failed_node_until_it_passes_and_leaves_an_operators_drain(
    slurm: LocalSlurm, tmp_path: Path
) -> None:
    """n1's agent latched a failure (XID 79): the health check fails and drains n1 with its
    reason; once the operator clears the latch (the repair the agent cannot see) it passes and
    resumes n1. n2, drained by an operator with a reason of their own, stays drained as they
    left it, whatever the check finds."""
    spool = tmp_path / "spool-n1"
    _agent_with_a_latched_failure(spool, "n1")
    failed = sim_uuid("n1", 0, "n1")
    status, report = _health_check(slurm, spool, "n1")
    assert (status, report["fit"], report["slurm"]) == (1, False, "drained")
    assert report["failed"] == [f"GPU {failed} failed (latch: xid_79_gpu_has_fallen_off_the_bus)"]
    assert "DRAIN" in slurm.node_state("n1").split("+")
    assert slurm.node_reason("n1") == (
        f"gpumeter-healthcheck: GPU {failed} failed (latch: xid_79_gpu_has_fallen_off_the_bus)"
    )
    again = _health_check(slurm, spool, "n1")  # every interval: the same drain, nothing new
    assert (again[0], again[1]["slurm"]) == (1, "drained already")

    cleared = subprocess.run(
        [str(BIN / "gpumeter-agent"), "--clear-latch", "all", "--spool-dir", str(spool)],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert json.loads(cleared.stdout)["cleared"] == [failed]
    assert _health_check(slurm, spool, "n1") == (
        0, {"node": "n1", "fit": True, "failed": [], "slurm": "resumed"},
    )  # fmt: skip
    assert "DRAIN" not in slurm.node_state("n1").split("+") and slurm.node_reason("n1") == ""

    slurm.run("scontrol", "update", "NodeName=n2", "State=DRAIN", "Reason=fan swap")
    assert _health_check(slurm, tmp_path / "spool-n2", "n2")[1]["slurm"] == "unchanged"
    _agent_with_a_latched_failure(tmp_path / "spool-n2", "n2")
    status, report = _health_check(slurm, tmp_path / "spool-n2", "n2")
    assert (status, report["slurm"]) == (1, "left drained (fan swap)")
    assert "DRAIN" in slurm.node_state("n2").split("+") and slurm.node_reason("n2") == "fan swap"


def test_slurmds_health_check_program_drains_a_failed_node_and_resumes_it_once_repaired(
    tmp_path: Path,
) -> None:
    """As a provider installs it: slurm.conf's HealthCheckProgram is a two-line wrapper around
    ``gpumeter-agent --health-check --drain`` (slurm.conf takes no arguments), run by each
    slurmd every interval. n1's agent latched a failure: slurmd's check drains n1; the
    operator clears the latch (the repair the agent cannot see): the next check resumes it."""
    wrapper = tmp_path / "gpumeter-healthcheck"
    conf = tmp_path / "slurm" / "slurm.conf"  # where running_slurm writes it
    wrapper.write_text(
        "#!/bin/sh\n"
        f"export SLURM_CONF={conf}\n"  # only because slurmd -N shares a host
        f"exec {BIN / 'gpumeter-agent'} --health-check --drain --simulate 2 "
        f'--spool-dir {tmp_path}/spool-"$SLURMD_NODENAME" '
        '--node-name "$SLURMD_NODENAME" --uuid-prefix "$SLURMD_NODENAME"\n'
    )
    wrapper.chmod(0o755)
    with running_slurm(tmp_path, WORKERS, SPARES, health_check=wrapper) as cluster:
        _agent_with_a_latched_failure(tmp_path / "spool-n1", "n1")
        failed = sim_uuid("n1", 0, "n1")
        drained = (
            f"gpumeter-healthcheck: GPU {failed} failed (latch: xid_79_gpu_has_fallen_off_the_bus)"
        )
        wait_for(lambda: cluster.node_reason("n1") == drained, "slurmd's check draining n1", 60)
        assert "DRAIN" in cluster.node_state("n1").split("+")
        assert "DRAIN" not in cluster.node_state("n2").split("+")  # fit: left in service
        subprocess.run(
            [str(BIN / "gpumeter-agent"), "--clear-latch", "all", "--spool-dir",
             str(tmp_path / "spool-n1")],
            capture_output=True, timeout=60, check=True,
        )  # fmt: skip
        wait_for(lambda: cluster.node_reason("n1") == "", "slurmd's check resuming n1", 60)
        assert "DRAIN" not in cluster.node_state("n1").split("+")
