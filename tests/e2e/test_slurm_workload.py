"""A provider-shaped Slurm under a workload: slurmctld, slurmdbd on MariaDB with enforced
associations, four ``slurmd -N`` workers and a hot spare (two GPUs each), three accounts mapped
to three customers and one mapped to none; the real service, agents and adapter (on a
scheduler key). Over 200 jobs: an array, single- and multi-node batch jobs, interactive
``salloc``/``srun``, ``--no-requeue``, jobs preempted (requeued) by a higher-priority QOS,
cancellations, a time limit, jobs that end while the adapter is stopped for longer than
MinJobAge, and two GPU failures while the bulk runs (a node's agent restarted with a fault
script: GPU 0 falls off the bus): a requeueable job is moved onto the hot spare, a
``--no-requeue`` one is abandoned with the reason. For every job, gpumeter's assignments are
accounting's runs (``sacct -D``) to the second, GPU for GPU (a failed-over job's failed GPU to
its first failed second); every job of the unmapped account is a reported problem.

Slurm, slurmdbd and MariaDB come from Debian's packages (``.ci/run`` installs them); without
them this test skips, except in CI, where it fails."""

from __future__ import annotations

import json
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from app.core.console_client import Api
from app.core.epoch import epoch
from app.core.processes import stop_child, wait_until
from app.demo.slurm_cluster import URGENT_QOS, LocalSlurm
from metering_agent.nvml.simulated import DEFAULT_MODEL, sim_uuid
from tests.e2e.conftest import BIN, Fleet
from tests.harness import running_slurm, wait_for

# Alone: with the suite's four workers on two cores, the adapter's rounds slip and a requeue
# seen late was attributed from the first run's start once (job 3: 125 s too early, see the
# closing note of issue 41); on a machine of its own it holds to the second.
pytestmark = [pytest.mark.e2e, pytest.mark.alone, pytest.mark.xdist_group("slurm")]

CLUSTER = "provider"
WORKERS, SPARES = ["n1", "n2", "n3", "n4"], ["n5"]
CUSTOMERS = {"acme-ml": "Acme AI", "beta-lab": "Beta Labs", "gamma-ai": "Gamma AI"}
UNMAPPED = "physics-lab"
MIN_JOB_AGE_S = 5
ADAPTER_AWAY_S = 15  # longer than MinJobAge
WORKLOAD_TIMEOUT_S = 420
# The failing jobs run this long: past an agent's restart, the failure's detection and the
# adapter's failover, on a loaded machine. Their GPU is reset this long after its agent's
# restart: after the failover, while the job that stayed still runs (no later job is handed
# a failed GPU).
FAILING_JOB_S = 60
REPAIR_AFTER_S = 30
FAILOVER_TIMEOUT_S = 90
CATCH_UP_TIMEOUT_S = 60  # the adapter back: every end it missed, read from accounting


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalSlurm]:
    accounts = [*CUSTOMERS, UNMAPPED]
    with running_slurm(
        tmp_path, WORKERS, SPARES, accounts=accounts, min_job_age_s=MIN_JOB_AGE_S
    ) as slurm:
        yield slurm


def gpu(node: str, index: int) -> str:
    return sim_uuid(node, index, node)


class Agents:
    """The node agents the test runs, each restarted by its PID to script a fault."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.tokens: dict[str, str] = {}
        self.running: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, node: str, token: str, faults: list[dict] | None = None) -> None:
        self.tokens[node] = token
        self.running[node] = self.fleet.agent(node, token, "--simulate", "2", faults=faults)

    def fail_gpu0(self, node: str) -> None:
        """The node's GPU 0 falls off the bus (XID 79) a second after its agent restarts (its
        spool kept: nothing it recorded is lost), and is reset ``REPAIR_AFTER_S`` later."""
        assert stop_child(self.running[node], f"agent {node}") == 0
        faults = [{"at": 1, "gpu": 0, "fault": "xid", "xid": 79},
                  {"at": REPAIR_AFTER_S, "gpu": 0, "fault": "recover"}]  # fmt: skip
        self.start(node, self.tokens[node], faults)


def _provider(fleet: Fleet, agents: Agents) -> tuple[Api, str]:
    """Five nodes (n5's GPUs hot spares) with agents, a plan, three customers mapped to
    their accounts; the adapter's scheduler key."""
    api = Api(fleet.service.url, fleet.admin)
    for node in WORKERS + SPARES:
        created = api.post("/v1/nodes", {"hostname": node, "datacenter": "e2e",
                                         "topology_group": "nvl-1"})  # fmt: skip
        pool = "spare" if node in SPARES else "rentable"
        for i in range(2):
            api.post("/v1/gpus", {"uuid": gpu(node, i), "node_id": created["node"]["id"],
                                  "model": DEFAULT_MODEL, "pool": pool})  # fmt: skip
        agents.start(node, created["token"]["key"])
    prices = [{"gpu_model": DEFAULT_MODEL, "price_per_hour": "36.00",
               "effective_from": "2026-01-01T00:00:00Z"}]  # fmt: skip
    plan = api.post("/v1/plans", {"name": "per second", "prices": prices})
    for account, name in CUSTOMERS.items():
        customer = api.post("/v1/customers", {"name": name, "currency": "USD"})
        mapping = {"customer_id": customer["id"], "plan_id": plan["id"]}
        api.call("PUT", f"/v1/slurm/accounts/{account}", mapping)
    return api, api.post("/v1/keys/scheduler", {"name": "gpumeter-slurm"})["key"]


@pytest.fixture
def adapters(fleet: Fleet) -> Iterator[list[subprocess.Popen[bytes]]]:
    """The adapter processes a test starts, each stopped by its PID if still running."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        stop_child(process, "gpumeter-slurm")


def _adapter(
    fleet: Fleet, slurm: LocalSlurm, key: str, started: list[subprocess.Popen[bytes]]
) -> subprocess.Popen[bytes]:
    with (fleet.tmp / f"adapter-{len(started)}.log").open("ab") as log:
        process = subprocess.Popen(
            [str(BIN / "gpumeter-slurm"), "--server", fleet.service.url, "--token", key,
             "--cluster", CLUSTER, "--slurm-conf", str(slurm.conf), "--poll-interval", "0.5"],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    started.append(process)
    return process


class Workload:
    """Jobs submitted, each with the GPUs it holds on each of its nodes (one unless said)."""

    def __init__(self, slurm: LocalSlurm) -> None:
        self.slurm = slurm
        self.gpus_per_node: dict[int, int] = {}
        self.interactive: list[subprocess.Popen[bytes]] = []

    def batch(self, account: str, seconds: int, *, nodes: int = 1, gpus: int = 1,
              options: tuple[str, ...] = ()) -> list[int]:  # fmt: skip
        out = self.slurm.run(
            "sbatch", "--parsable", f"--nodes={nodes}", f"--gres=gpu:{gpus}",
            f"--account={account}", "--output=/dev/null", f"--chdir={self.slurm.directory}",
            *options, "--wrap", f"sleep {seconds}",
        )  # fmt: skip
        job_id = int(out.strip().split(";")[0])
        self.gpus_per_node[job_id] = gpus  # an array's tasks (other ids) hold one GPU each
        return [job_id]

    def salloc(self, account: str, seconds: int) -> None:
        """An interactive job: salloc runs srun in it, and waits."""
        argv = ["salloc", "--nodes=1", "--gres=gpu:1", f"--account={account}",
                "srun", "sleep", str(seconds)]  # fmt: skip
        quiet = subprocess.DEVNULL
        session = subprocess.Popen(argv, env=self.slurm.env, stdout=quiet, stderr=quiet)
        self.interactive.append(session)

    def active(self) -> list[str]:
        return self.slurm.run("squeue", "-h", "-t", "PD,R,CG,CF,S", "-o", "%i").split()

    def running(self, job_ids: list[int]) -> bool:
        states = self.slurm.run("squeue", "-h", "-o", "%i %t").split()
        running = {states[i] for i in range(0, len(states), 2) if states[i + 1] == "R"}
        return all(str(job_id) in running for job_id in job_ids)

    def node_of(self, job_id: int) -> str:
        """The node a running one-node job runs on."""
        return self.slurm.run("squeue", "-h", "-j", str(job_id), "-o", "%N").strip()


def _accounting(slurm: LocalSlurm) -> dict[int, list[dict[str, Any]]]:
    """sacct -D's records of every job (an array's tasks each their own), by job id."""
    document = json.loads(slurm.run("sacct", "--json", "-D", "-X", "-a", "-S", "2020-01-01"))
    runs: dict[int, list[dict[str, Any]]] = {}
    for record in document["jobs"]:
        runs.setdefault(int(record["job_id"]), []).append(record)
    return runs


def _expected(records: list[dict[str, Any]], gpus: int, slurm: LocalSlurm) -> list[tuple]:
    """(node, start, end) for each GPU of each run that lasted a second or more."""
    expected = []
    for record in records:
        start, end = int(record["time"]["start"]), int(record["time"]["end"])
        if start and end > start:
            nodes = slurm.run("scontrol", "show", "hostnames", record["nodes"]).split()
            expected += [(node, start, end) for node in nodes for _ in range(gpus)]
    return sorted(expected)


NODE_OF = {gpu(node, i): node for node in WORKERS + SPARES for i in range(2)}


def _assigned(api: Api, rental_id: str) -> list[tuple]:
    """(node, start, end) of each of the rental's assignments."""
    rental = api.get(f"/v1/rentals/{rental_id}")
    return sorted(
        (NODE_OF[a["gpu_uuid"]], _s(a["start_at"]), _s(a["end_at"])) for a in rental["assignments"]
    )


def _s(moment: str | None) -> int | None:
    return None if moment is None else epoch(datetime.fromisoformat(moment))


def test_every_jobs_assignments_are_accountings_runs_to_the_second(
    fleet: Fleet, cluster: LocalSlurm, adapters: list[subprocess.Popen[bytes]]
) -> None:
    agents = Agents(fleet)
    api, key = _provider(fleet, agents)
    adapter = _adapter(fleet, cluster, key, adapters)
    work = Workload(cluster)
    acme, beta, gamma = CUSTOMERS
    # Long jobs first: some to cancel, some to be preempted, two to time out.
    cancelled = [*work.batch(beta, 300), *work.batch(gamma, 300)]
    preempted = work.batch(acme, 20, nodes=2, gpus=2) + work.batch(beta, 20, gpus=2)
    timed_out = work.batch(gamma, 1000, options=("--time=1",))  # with the above: 7 GPUs
    wait_for(lambda: work.running(cancelled + preempted), "the long jobs running", 60)
    cluster.run("scancel", *map(str, cancelled))
    urgent = ("--qos", URGENT_QOS)
    for account in CUSTOMERS:  # four nodes' worth: every preemptable job is requeued
        work.batch(account, 4, nodes=1, gpus=2, options=urgent)
    work.batch(acme, 4, nodes=1, gpus=2, options=urgent)
    # Two whole nodes' jobs whose GPU will fail (urgent: no other job preempts them): one Slurm
    # can requeue, one it cannot.
    movable = work.batch(gamma, FAILING_JOB_S, gpus=2, options=urgent)
    stuck = work.batch(beta, FAILING_JOB_S, gpus=2, options=(*urgent, "--no-requeue"))
    # The bulk: an array, single and multi-node jobs, --no-requeue, the unmapped account.
    work.batch(acme, 3, options=("--array=0-79",))
    # While the array runs, a GPU of each failing job's node fails.
    failing = movable + stuck
    wait_for(lambda: work.running(failing), "the failing jobs running", 90)
    wait_for(lambda: _attributed(api, failing), "the failing jobs attributed", 30)
    failed_nodes = {job_id: work.node_of(job_id) for job_id in failing}
    for node in failed_nodes.values():
        agents.fail_gpu0(node)
    for i in range(60):
        work.batch((beta, gamma)[i % 2], 3 + i % 3, gpus=1 + i % 2)
    for i in range(16):
        work.batch((acme, gamma)[i % 2], 4, nodes=2, gpus=2)
    for _ in range(10):
        work.batch(beta, 3, options=("--no-requeue",))
    for _ in range(10):
        work.batch(UNMAPPED, 3)
    for i in range(8):
        work.salloc((acme, beta)[i % 2], 4)
    rentals = [row["rental_id"] for row in _jobs(api) if row["job_id"] in failing]
    wait_for(lambda: _answered(api, rentals), "both failovers answered", FAILOVER_TIMEOUT_S)
    wait_for(lambda: not work.active(), "the bulk done", WORKLOAD_TIMEOUT_S)
    # Eight GPUs' worth of jobs running, attributed; the adapter away for longer than
    # MinJobAge while they end.
    away = work.batch(gamma, 6, nodes=2)  # first: the single jobs would pack the nodes
    away += [j for i in range(6) for j in work.batch((acme, beta, gamma)[i % 3], 6)]
    wait_for(lambda: work.running(away), "the last jobs running", 60)
    wait_for(lambda: _attributed(api, away), "the last jobs attributed", 30)
    assert stop_child(adapter, "gpumeter-slurm") == 0
    wait_for(lambda: not work.active(), "the last jobs done", 30)
    time.sleep(ADAPTER_AWAY_S)  # the outage itself, past MinJobAge: nothing to wait for
    adapter = _adapter(fleet, cluster, key, adapters)
    for session in work.interactive:  # done, or preempted (Slurm cannot requeue them)
        session.wait(timeout=30)

    accounting = _accounting(cluster)
    mapped = {j for j, records in accounting.items() if records[0]["account"] in CUSTOMERS}

    def behind() -> dict[int, Any]:
        """The mapped jobs that ran and whose end is not attributed yet, with their rows."""
        rows = {r["job_id"]: r for r in _jobs(api)}
        ran = [j for j in mapped if _ran(accounting[j])]
        return {j: rows.get(j) for j in ran if not rows.get(j, {}).get("ended_at")}

    if not wait_until(lambda: not behind(), CATCH_UP_TIMEOUT_S, poll_s=0.5):
        pytest.fail(f"ends not attributed after {CATCH_UP_TIMEOUT_S} s: {behind()}")
    assert stop_child(adapter, "gpumeter-slurm") == 0
    rows = {r["job_id"]: r for r in _jobs(api)}
    reported = _reported(api)
    failovers = _failovers(api, rows)
    assert sorted(failovers) == sorted(failing), failovers
    [moved, given_up] = [failovers[job_id] for job_id in failing]
    # The requeueable job: the failed node's GPU 0, then requeued onto the spare, resumed at
    # the second Slurm started it there; the other, answered at once, the spare untouched.
    assert moved["failed_gpu_uuid"] == gpu(failed_nodes[movable[0]], 0), moved
    assert moved["state"] == "resumed" and moved["spare_gpu_uuid"] in (gpu("n5", 0), gpu("n5", 1))
    [first_run, on_spare] = accounting[movable[0]]
    assert (first_run["nodes"], on_spare["nodes"]) == (failed_nodes[movable[0]], "n5")
    assert _s(moved["resumed_at"]) == int(on_spare["time"]["start"])
    assert given_up["failed_gpu_uuid"] == gpu(failed_nodes[stuck[0]], 0), given_up
    reason = f"job {stuck[0]} was submitted with --no-requeue: Slurm cannot requeue it"
    assert (given_up["state"], given_up["reason"]) == ("abandoned", reason)
    assert len(accounting[stuck[0]]) == 1  # it ran on, on its node, as Slurm had it
    checked, partly = 0, 0
    for job_id in sorted(mapped):
        expected = _expected(accounting[job_id], work.gpus_per_node.get(job_id, 1), cluster)
        if failovers.get(job_id, {}).get("state") == "resumed":
            expected = _moved_off(expected, failovers[job_id])
        if not expected:
            assert job_id not in rows or rows[job_id]["rental_id"] is None
            continue
        rental = rows[job_id]["rental_id"]
        assigned = _assigned(api, rental) if rental else []
        if reported.get(job_id):
            # A run no round saw holding its GPUs (seen only in its first second, or begun
            # and ended between two rounds), or one refused: reported, never guessed; every
            # second billed is one accounting has.
            assert not Counter(assigned) - Counter(expected), (job_id, assigned, expected)
            partly += 1
            continue
        assert assigned == expected, (job_id, rows[job_id], assigned, expected)
        checked += 1
    unmapped = [j for j in accounting if j not in mapped and _ran(accounting[j])]
    problems = Counter(reason for reasons in reported.values() for reason in reasons)
    assert unmapped and all(rows[j]["rental_id"] is None for j in unmapped)
    # Reported: the account (its run seen), or the run itself (seen only in its first second).
    assert all(reported.get(j, set()) & {"unknown_account", "unseen_runs"} for j in unmapped)
    assert sum("unknown_account" in reported.get(j, set()) for j in unmapped) >= len(unmapped) // 2
    requeued = [j for j in preempted if len(accounting[j]) > 1]
    assert requeued, "no job was preempted and requeued"
    assert all(accounting[j][-1]["state"]["current"] == "TIMEOUT" for j in timed_out)
    assert len(accounting) >= 200 and all(j in accounting for j in away)
    assert sum(1 for records in accounting.values() if records[0]["account"] in CUSTOMERS) > 150
    assert checked >= 150
    fault_to_running = int(on_spare["time"]["start"]) - epoch(
        datetime.fromisoformat(moved["failed_at"])
    )
    print(json.dumps({"jobs": len(accounting), "assignments_checked_jobs": checked,
                      "reported_jobs_billed_within_accounting": partly,
                      "requeued": len(requeued), "problems": dict(problems),
                      "failovers": {f["state"]: f.get("reason") for f in failovers.values()},
                      "fault_to_running_on_spare_s": fault_to_running}))  # fmt: skip


def _answered(api: Api, rental_ids: list[str]) -> bool:
    """A failover of each rental, resumed or abandoned."""
    answered = {
        f["rental_id"] for f in api.get("/v1/failovers", limit=100)["items"]
        if f["state"] in ("resumed", "abandoned")
    }  # fmt: skip
    return answered >= set(rental_ids)


def _failovers(api: Api, rows: dict[int, dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Every failover, by its rental's job (one each)."""
    job_of = {row["rental_id"]: job_id for job_id, row in rows.items() if row["rental_id"]}
    failovers: dict[int, dict[str, Any]] = {}
    for failover in api.get("/v1/failovers", limit=100)["items"]:
        job_id = job_of[failover["rental_id"]]
        assert job_id not in failovers, (failovers.get(job_id), failover)
        failovers[job_id] = failover
    return failovers


def _moved_off(expected: list[tuple], failover: dict[str, Any]) -> list[tuple]:
    """Accounting's runs as a failed-over job is billed: its failed GPU's run ends at the
    first failed second (the migration window is credited from there; the requeue may come
    in that very second), the rest as ran."""
    node, failed = NODE_OF[failover["failed_gpu_uuid"]], _s(failover["failed_at"])
    cut = next(run for run in expected if run[0] == node and run[1] <= failed <= run[2])
    moved = list(expected)
    moved[moved.index(cut)] = (node, cut[1], failed)
    return sorted(moved)


def _attributed(api: Api, job_ids: list[int]) -> bool:
    rows = {r["job_id"]: r for r in _jobs(api)}
    return all(rows.get(j, {}).get("rental_id") for j in job_ids)


def _reported(api: Api) -> dict[int, set[str]]:
    """Every problem published (slurm.job_unattributed), job by job."""
    events = api.get("/v1/events", type="slurm.job_unattributed", limit=1000)["items"]
    reported: dict[int, set[str]] = {}
    for event in events:
        reported.setdefault(event["data"]["job_id"], set()).add(event["data"]["reason"])
    return reported


def _ran(records: list[dict[str, Any]]) -> bool:
    return any(int(r["time"]["end"]) > int(r["time"]["start"]) > 0 for r in records)


def _jobs(api: Api) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    offset = 0
    while page := api.get("/v1/slurm/jobs", cluster=CLUSTER, limit=500, offset=offset)["items"]:
        rows += page
        offset += len(page)
    return rows
