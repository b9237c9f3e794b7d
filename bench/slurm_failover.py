"""The failure loop through a real Slurm: fault -> failover.requested -> the adapter drains the
node and requeues the job onto the spare -> the job RUNNING there -> resumed -> the exact credit.

Real processes on this host: slurmctld and a ``slurmd -N`` per node (``app.demo.slurm_cluster``:
n1, n2 workers, n3 the hot spare, two GPUs each), ``gpumeter serve`` on a fresh database, a
simulating ``gpumeter-agent`` per node, and the adapter (``gpumeter-slurm``). One two-node job
runs throughout, with ``--background`` other jobs in the cluster (default 200, another
tenant's, one GPU each, 2-6 s): they run one after another on ``--background-nodes`` nodes of
their own (b1, b2, ...; not the failover's three) and stay listed once ended (MinJobAge), so
every round of the adapter reads, and every snapshot carries, a cluster of 200 more jobs.
Failure k fails GPU 0 of the node that is then the job's first (XID 79) and resets it
``--repair-after`` seconds later; the adapter resumes the repaired node and it becomes the spare,
so the next failure moves the job again: n1 -> n3, n2 -> n1, n3 -> n2, ...

Measured per failure, from the first failed second (the failover's ``failed_at``, from
telemetry) to the second Slurm started the job on the spare (its ``start_time``, which the
adapter reports as ``resumed_at``). Offered vs done: failures scripted, failovers requested,
resumed, jobs running on the spare; a failure that did not fail over counts against the run.
Credited: the invoice's credit lines against the sum of resumed - failed seconds.

Prints progress on stderr and one final JSON line on stdout. Needs Slurm (apt-get install
slurm-wlm) and runs as root (slurmd). Creates and drops its own database on the server of
GPUMETER_DATABASE_URL (default postgresql://postgres@127.0.0.1/postgres).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from contextlib import ExitStack
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from failover import percentile, say  # bench/ is this script's directory

import app.models  # noqa: F401 - registers every table, so foreign keys resolve
from app.auth.models import KeyKind
from app.auth.service import issue_key
from app.billing.core.lines import CREDIT_KINDS
from app.core import migrate
from app.core.console_client import Api
from app.core.db import get_engine, transaction
from app.core.epoch import epoch, from_epoch
from app.core.local_service import free_port, wait_until_ready
from app.core.processes import stop_child, wait_until
from app.core.scratch_db import scratch_database, server_from_environment
from app.demo.slurm_cluster import LocalSlurm, installed
from app.slurm.scheduler import Slurm
from metering_agent.nvml.simulated import DEFAULT_MODEL, sim_uuid

BIN = Path(sys.executable).parent
NODES = ["n1", "n2", "n3"]  # the job starts on n1 + n2; n3 is the spare
TARGET_P99_S = 30.0  # the seed's promise: fault -> job running on the spare
FIRST_FAULT_S = 15.0  # after the agents start: the job is attributed by then
ACCOUNT = "bench"
TENANT = "tenants"  # the background jobs' account, mapped to a customer of its own
PRICE = "36.00"  # one cent a second


def failing_node(k: int) -> str:
    """The job's first node at failure k: each failover swaps the failed node for the spare."""
    return NODES[k % len(NODES)]


class Bench:
    def __init__(self, args: argparse.Namespace, directory: Path, stack: ExitStack) -> None:
        self.args, self.directory, self.stack = args, directory, stack
        self.started = 0  # processes, for their log files' names

    def run(self, url: str) -> dict[str, Any]:
        migrate.upgrade(url)
        with transaction(get_engine(url)) as session:
            admin = issue_key(session, KeyKind.ADMIN, "bench slurm adapter").secret
        slurm = LocalSlurm(self.directory / "slurm", NODES[:2] + self.others, NODES[2:])
        slurm.directory.mkdir()
        slurm.start()
        self.stack.callback(slurm.stop)
        base = self._serve(url)
        api = Api(base, admin)
        self.stack.callback(api.close)
        customer, tokens = self._provider(api)
        self._start("gpumeter-slurm", [
            "--server", base, "--token", admin, "--cluster", "bench", "--slurm-conf",
            str(slurm.conf), "--poll-interval", "0.5",
        ])  # fmt: skip
        background = self._background(slurm)  # held: submitting 200 jobs takes a while
        for node in NODES + self.others:
            self._agent(base, node, tokens[node])
        # A job that runs before its GPUs' first report is refused (unknown_gpu_index).
        if not wait_until(lambda: _reported(api), FIRST_FAULT_S, poll_s=0.5):
            raise RuntimeError(f"the agents did not report within {FIRST_FAULT_S:g} s")
        job_id = slurm.submit(ACCOUNT, nodes=2, extra=("--nodelist=" + ",".join(NODES[:2]),))
        if background:
            slurm.run("scontrol", "release", ",".join(map(str, background)))
        say(f"job {job_id} on n1 + n2, {len(background)} other jobs; "
            f"{self.args.failures} failures every {self.args.every} s")  # fmt: skip
        last = FIRST_FAULT_S + (self.args.failures - 1) * self.args.every
        wait_until(
            lambda: self._progress(api) >= self.args.failures,
            last + self.args.settle,
            poll_s=1.0,
        )
        slurm.run("scancel", str(job_id), *map(str, background))
        completed = _completed(slurm, background)
        wait_until(lambda: _ended(api, [job_id, *completed]), 30, poll_s=0.5)
        figures = self._measure(api, slurm, customer, job_id)
        return figures | _background_figures(api, slurm, background)

    @property
    def others(self) -> list[str]:
        """The background jobs' nodes."""
        return [f"b{i + 1}" for i in range(self.args.background_nodes)]

    def _background(self, slurm: LocalSlurm) -> list[int]:
        """The other jobs, submitted held (released once the agents run): one GPU each for
        2-6 s, kept off the failover's nodes."""
        held = ("sbatch", "--parsable", "--hold", "--gres=gpu:1", f"--account={TENANT}",
                f"--exclude={','.join(NODES)}", "--output=/dev/null",
                f"--chdir={slurm.directory}", "--wrap")  # fmt: skip
        submitted = [slurm.run(*held, f"sleep {2 + i % 5}") for i in range(self.args.background)]
        return [int(out.strip().split(";")[0]) for out in submitted]

    def _progress(self, api: Api) -> int:
        resumed = len(api.get("/v1/failovers", state="resumed", limit=1000)["items"])
        say(f"{resumed} of {self.args.failures} failovers resumed")
        return resumed

    def _serve(self, url: str) -> str:
        port = free_port()
        env = {**os.environ, "GPUMETER_DATABASE_URL": url,
               "GPUMETER_SECRET_KEY": secrets.token_urlsafe(32)}  # fmt: skip
        server = self._start("gpumeter", ["serve", "--port", str(port)], env)
        base = f"http://127.0.0.1:{port}"
        wait_until_ready(base, server, timeout_s=90)
        return base

    def _start(
        self, command: str, argv: list[str], env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        self.started += 1
        log = (self.directory / f"{command}-{self.started}.log").open("wb")
        self.stack.callback(log.close)
        process = subprocess.Popen(
            [str(BIN / command), *argv], env=env, stdout=log, stderr=subprocess.STDOUT
        )
        self.stack.callback(stop_child, process, command)
        return process

    def _provider(self, api: Api) -> tuple[str, dict[str, str]]:
        prices = [{"gpu_model": DEFAULT_MODEL, "price_per_hour": PRICE,
                   "effective_from": "2026-01-01T00:00:00Z"}]  # fmt: skip
        plan = api.post("/v1/plans", {"name": "bench", "prices": prices})
        customer = api.post("/v1/customers", {"name": "Bench AI"})
        api.call("PUT", f"/v1/slurm/accounts/{ACCOUNT}",
                 {"customer_id": customer["id"], "plan_id": plan["id"]})  # fmt: skip
        tenant = api.post("/v1/customers", {"name": "Other Tenant"})
        api.call("PUT", f"/v1/slurm/accounts/{TENANT}",
                 {"customer_id": tenant["id"], "plan_id": plan["id"]})  # fmt: skip
        tokens = {}
        for node in NODES + self.others:
            created = api.post("/v1/nodes", {"hostname": node, "datacenter": "bench-1"})
            tokens[node] = created["token"]["key"]
            pool = "spare" if node == NODES[-1] else "rentable"
            for i in range(2):
                api.post("/v1/gpus", {"uuid": sim_uuid(node, i, node), "model": DEFAULT_MODEL,
                                      "node_id": created["node"]["id"], "pool": pool})  # fmt: skip
        return customer["id"], tokens

    def _agent(self, base: str, node: str, token: str) -> None:
        steps = []
        for k in range(self.args.failures):
            if failing_node(k) == node:
                at = FIRST_FAULT_S + k * self.args.every
                repaired = at + self.args.repair_after
                steps += [{"at": at, "gpu": 0, "fault": "xid", "xid": 79},
                          {"at": repaired, "gpu": 0, "fault": "recover"}]  # fmt: skip
        script = self.directory / f"faults-{node}.json"
        script.write_text(json.dumps(steps))
        self._start("gpumeter-agent", [
            "--server", base, "--token", token,
            "--spool-dir", str(self.directory / f"spool-{node}"),
            "--node-name", node, "--uuid-prefix", node, "--simulate", "2", "--faults", str(script),
            "--upload-interval", "1",
        ])  # fmt: skip

    def _measure(self, api: Api, slurm: LocalSlurm, customer: str, job_id: int) -> dict[str, Any]:
        failovers = api.get("/v1/failovers", limit=1000)["items"]
        resumed = [f for f in failovers if f["state"] == "resumed"]
        latency = [float(_s(f["resumed_at"]) - _s(f["failed_at"])) for f in resumed]
        expected = sum(_s(f["resumed_at"]) - _s(f["failed_at"]) for f in resumed)
        api.post("/v1/invoices/runs", {"period": f"{from_epoch(int(time.time())):%Y-%m}"})
        credited, cents = 0, Decimal(0)
        for listed in api.get("/v1/invoices", customer_id=customer)["items"]:
            for line in api.get(f"/v1/invoices/{listed['id']}")["lines"]:
                if line["kind"] in CREDIT_KINDS:
                    credited += line["seconds"] or 0
                    cents -= Decimal(line["amount"]) * 100
        # Slurm 22.05's squeue --json ignores --jobs: the job's record is found among them all.
        job = Slurm(slurm.conf).job(job_id)
        figures = {
            "fault_to_running_p50_s": percentile(latency, 0.5),
            "fault_to_running_p99_s": percentile(latency, 0.99),
            "fault_to_running_max_s": max(latency, default=None),
        }
        passed = {
            "every_failure_failed_over": len(resumed) == self.args.failures,
            "p99_within_target": figures["fault_to_running_p99_s"] is not None
            and figures["fault_to_running_p99_s"] <= TARGET_P99_S,
            "credited_exact": credited == expected and cents == expected,
        }
        return {
            "bench": "slurm_failover",
            "failures_scripted": self.args.failures,
            "failovers_requested": len(failovers),
            "failovers_resumed": len(resumed),
            "job_restarts": None if job is None else job.restarts,
            **figures,
            "latencies_s": latency,
            "credited_s": credited,
            "credited_cents": str(cents),
            "expected_credited_s": expected,
            "target_p99_s": TARGET_P99_S,
            "pass": passed,
            "ok": all(passed.values()),
            "loadavg_1m": round(os.getloadavg()[0], 2),
        }


def _s(moment: str) -> int:
    return epoch(datetime.fromisoformat(moment))


def _reported(api: Api) -> bool:
    """Every GPU reported by its agent (with its device index, which attribution needs)."""
    return all(gpu["last_seen_at"] for gpu in api.get("/v1/gpus", limit=1000)["items"])


def _rows(api: Api) -> dict[int, dict[str, Any]]:
    """gpumeter's Slurm jobs, by id."""
    rows: list[dict[str, Any]] = []
    while page := api.get("/v1/slurm/jobs", cluster="bench", limit=500, offset=len(rows))["items"]:
        rows += page
    return {row["job_id"]: row for row in rows}


def _completed(slurm: LocalSlurm, job_ids: list[int]) -> list[int]:
    """Those of the jobs that ran to their end (Slurm keeps every job's record: MinJobAge is an
    hour). Not those the bench's end cancelled: one that began in the last round's second may
    have run unseen, and this cluster has no accounting to tell."""
    wanted = set(job_ids)
    return [
        job.job_id for job in Slurm(slurm.conf).jobs()
        if job.job_id in wanted and job.state == "COMPLETED"
    ]  # fmt: skip


def _ended(api: Api, job_ids: list[int]) -> bool:
    rows = _rows(api)
    return all(rows.get(job_id, {}).get("ended_at") for job_id in job_ids)


def _background_figures(api: Api, slurm: LocalSlurm, background: list[int]) -> dict[str, Any]:
    """The other jobs: those that ran to their end, and of them those gpumeter attributed to
    their tenant; problems reported."""
    completed = _completed(slurm, background)
    rows = _rows(api)
    events = api.get("/v1/events", type="slurm.job_unattributed", limit=1000)["items"]
    return {
        "background_jobs": len(background),
        "background_jobs_completed": len(completed),
        "background_jobs_attributed": sum(1 for j in completed if rows[j]["rental_id"]),
        "problems_reported": len(events),
        "problems_by_reason": dict(Counter(e["data"]["reason"] for e in events)),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--failures", type=int, default=6, help="GPU failures, one at a time")
    parser.add_argument("--every", type=float, default=30.0, help="seconds between failures")
    parser.add_argument("--repair-after", type=float, default=12.0, help="seconds to the reset")
    parser.add_argument("--settle", type=float, default=60.0, help="seconds after the last")
    parser.add_argument("--background", type=int, default=200, help="other jobs in the cluster")
    parser.add_argument("--background-nodes", type=int, default=2, help="their nodes (2 GPUs)")
    parser.add_argument("--keep", type=Path, help="keep the logs and spools in this directory")
    args = parser.parse_args()
    if not installed():
        raise SystemExit("Slurm is not installed: apt-get install slurm-wlm")
    if args.background < 0 or args.background_nodes < (args.background > 0):
        raise SystemExit("--background must be >= 0, with --background-nodes >= 1 for any")
    if args.repair_after >= args.every:
        raise SystemExit("--repair-after must be shorter than --every (the node must be a spare)")
    # SIGTERM unwinds the stack like an error: every process it started is stopped by its PID.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started = time.monotonic()
    with ExitStack() as stack:
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
            directory = args.keep
        else:
            directory = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="slurm-")))
        url = stack.enter_context(scratch_database(server_from_environment(), "gpumeter_slurm"))
        result = Bench(args, directory, stack).run(url)
    result["wall_s"] = round(time.monotonic() - started, 1)
    print(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
