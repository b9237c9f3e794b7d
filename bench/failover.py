"""The failure loop end to end: fault -> the service sees ``failed`` -> ``failover.requested``
webhook -> the orchestrator's resume -> the exact credit on the invoice; and the same loop for
GPUs degraded past their plan's time (issue 42).

Real processes: ``gpumeter serve`` (with its job-queue worker, which delivers the webhooks)
on a fresh database, and ``--nodes`` ``gpumeter-agent --simulate`` processes whose fault
scripts fail ``--failures`` rented GPUs (fatal XIDs, uncorrectable ECC), spread over
``--spread`` seconds. The orchestrator (``app.demo.orchestrator``) receives the signed webhooks
on 127.0.0.1 and answers each ``failover.requested`` ``--resume-after`` seconds later with
``POST /v1/failovers/{id}/resumed``. Every rental is one GPU; the other GPUs are spares.
``--degraded`` more rented GPUs are degraded for good instead (thermal slowdown, power brake,
NVLink down), on a plan that migrates a GPU degraded ``--degraded-after`` seconds by them.

Measured per failure, from the first failed second the agent reported (the GPU's timeline: the
simulated fault takes effect at the agent's next 1 Hz sample, labelled with that second):
- detection: until the service published ``gpu.state_changed`` to ``failed`` (its time);
- request: until the orchestrator received ``failover.requested`` (its clock, same machine).
Credited: the credit lines' seconds on each rental's draft invoice against the exact
expectation, resumed second minus first failed second.
Degraded, from the second the plan's time was up (first degraded second + ``--degraded-after``):
- degraded_resume: until the job ran on the spare (the orchestrator's resumed second; promise:
  p99 <= 30 s). Its credit is the migration window, resumed second minus the second decided.

Prints progress on stderr and one final JSON line on stdout. Creates and drops its own
database on the server of GPUMETER_DATABASE_URL (default postgresql://postgres@127.0.0.1/postgres).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import app.models  # noqa: F401 - registers every table, so foreign keys resolve
from app.auth.models import KeyKind
from app.auth.service import issue_key
from app.billing.core.lines import CREDIT_KINDS
from app.core import migrate
from app.core.console_client import Api
from app.core.db import get_engine, transaction
from app.core.epoch import from_epoch
from app.core.local_service import free_port, wait_until_ready
from app.core.processes import stop_child, wait_until
from app.core.scratch_db import scratch_database, server_from_environment
from app.demo.orchestrator import REQUESTED, Orchestrator
from metering_agent.nvml.simulated import DEFAULT_MODEL, sim_uuid

BIN = Path(sys.executable).parent
TARGETS = {"detection_p99_s": 3.0, "request_p99_s": 5.0}
DEGRADED_TARGETS = {"degraded_resume_p99_s": 30.0}
FIRST_FAULT_S = 12.0  # after the agents start: every GPU has reported by then
FAULTS = [  # cycled: each fails the GPU for good (fatal XIDs hold for 5 min, a lost GPU stays)
    {"fault": "xid", "xid": 79},
    {"fault": "xid", "xid": 48},
    {"fault": "dbe", "count": 2},
    {"fault": "xid", "xid": 95},
    {"fault": "xid", "xid": 119},
]
DEGRADED_FAULTS = [  # cycled: each degrades the GPU for the rest of the run
    {"fault": "thermal_slowdown", "duration": 3600},
    {"fault": "power_brake", "duration": 3600},
    {"fault": "nvlink_down", "count": 1},
]
DEGRADED_CAUSES = ["thermal_slowdown", "power_brake", "nvlink_down"]
SETTLE_S = 60.0  # after the last fault: its webhook and its resume (bounds a slow run)


@dataclass(frozen=True)
class Failure:
    node: str
    index: int
    gpu: str
    at: float  # seconds after its agent started
    rental_id: str = ""
    degraded: bool = False  # degraded for good (moved by the plan's policy), not failed


def say(message: str) -> None:
    print(f"[{datetime.now(UTC):%H:%M:%S}] {message}", file=sys.stderr, flush=True)


def percentile(values: list[float], share: float) -> float | None:
    """Nearest rank: the smallest value with at least ``share`` of them at or below it."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * share // 1))  # ceil without floats' surprises
    return round(ordered[int(rank) - 1], 3)


def plan_faults(nodes: list[str], failures: int, degraded: int, spread_s: float) -> list[Failure]:
    """``failures + degraded`` rented GPUs, round robin over the nodes, faulting one after
    another; every ``total // degraded``-th one is degraded, not failed."""
    total = failures + degraded
    step = spread_s / max(1, total - 1)
    every = total // degraded if degraded else 0
    return [
        Failure(
            nodes[k % len(nodes)],
            k // len(nodes),
            sim_uuid(nodes[k % len(nodes)], k // len(nodes)),
            FIRST_FAULT_S + k * step,
            degraded=bool(every) and k % every == every - 1 and k // every < degraded,
        )
        for k in range(total)
    ]


class Bench:
    def __init__(self, args: argparse.Namespace, directory: Path, stack: ExitStack) -> None:
        self.args, self.directory, self.stack = args, directory, stack
        self.nodes = [f"bench-{n}" for n in range(args.nodes)]
        self.failures = plan_faults(self.nodes, args.failures, args.degraded, args.spread)
        if max(f.index for f in self.failures) + 1 >= args.gpus_per_node:
            raise SystemExit("too few GPUs per node for the failures and their spares")

    def run(self, url: str) -> dict[str, Any]:
        migrate.upgrade(url)
        with transaction(get_engine(url)) as session:
            admin = issue_key(session, KeyKind.ADMIN, "bench orchestrator").secret
        base = self._serve(url)
        api = Api(base, admin)
        self.stack.callback(api.close)
        orchestrator = Orchestrator(api, self.args.resume_after)
        orchestrator.start()
        self.stack.callback(orchestrator.stop)
        orchestrator.register()
        tokens = self._provider(api)
        say(f"{len(self.failures)} rented GPUs, {self._spares()} spares; starting the agents")
        agents = self._agents(base, tokens)
        last_fault = time.time() + FIRST_FAULT_S + self.args.spread
        wait_until(
            lambda: len(orchestrator.resumed()) >= len(self.failures),
            last_fault + SETTLE_S - time.time(),
            poll_s=0.5,
        )
        ended = int(time.time()) + 1  # after the last resumed second: the spare served too
        wait_until(lambda: time.time() >= ended + 1, 5)
        for failure in self.failures:
            api.post(f"/v1/rentals/{failure.rental_id}/end", {"end_at": _iso(ended)})
        for agent in agents:
            stop_child(agent, "agent")
        say("drafting the invoices")
        api.post("/v1/invoices/runs", {"period": f"{from_epoch(ended):%Y-%m}"})
        return self._measure(api, orchestrator, ended)

    def _serve(self, url: str) -> str:
        port = free_port()
        env = {
            **os.environ,
            "GPUMETER_DATABASE_URL": url,
            "GPUMETER_WEBHOOK_ALLOW_PRIVATE": "true",  # the orchestrator listens on 127.0.0.1
            "GPUMETER_SECRET_KEY": secrets.token_urlsafe(32),
        }
        log = (self.directory / "server.log").open("wb")
        self.stack.callback(log.close)
        server = subprocess.Popen(
            [str(BIN / "gpumeter"), "serve", "--port", str(port)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.stack.callback(stop_child, server, "service")
        base = f"http://127.0.0.1:{port}"
        wait_until_ready(base, server, timeout_s=90)
        return base

    def _spares(self) -> int:
        return len(self.nodes) * self.args.gpus_per_node - len(self.failures)

    def _provider(self, api: Api) -> dict[str, str]:
        """Nodes, GPUs (the failing ones rented, one rental each; the rest spares), a plan,
        a customer; the node tokens."""
        price = {"gpu_model": DEFAULT_MODEL, "price_per_hour": self.args.price}
        policy = {
            "migrate_degraded_after_s": self.args.degraded_after,
            "migrate_degraded_causes": DEGRADED_CAUSES,
        }
        plan = api.post(
            "/v1/plans",
            {
                "name": "bench",
                "prices": [{**price, "effective_from": "2026-01-01T00:00:00Z"}],
                **policy,
            },
        )
        customer = api.post("/v1/customers", {"name": "Bench AI"})
        rented = {f.gpu for f in self.failures}
        tokens = {}
        for node in self.nodes:
            created = api.post("/v1/nodes", {"hostname": node, "datacenter": "bench-1"})
            tokens[node] = created["token"]["key"]
            for i in range(self.args.gpus_per_node):
                gpu = sim_uuid(node, i)
                pool = "rentable" if gpu in rented else "spare"
                body = {"uuid": gpu, "node_id": created["node"]["id"], "model": DEFAULT_MODEL}
                api.post("/v1/gpus", {**body, "pool": pool})
        start = _iso(int(time.time()))
        for k, failure in enumerate(self.failures):
            rental = api.post(
                "/v1/rentals",
                {
                    "customer_id": customer["id"],
                    "plan_id": plan["id"],
                    "gpu_model": DEFAULT_MODEL,
                    "gpu_count": 1,
                    "start_at": start,
                },
            )
            api.post(f"/v1/rentals/{rental['id']}/assignments", {"gpu_uuid": failure.gpu,
                                                                  "start_at": start})  # fmt: skip
            self.failures[k] = Failure(**{**failure.__dict__, "rental_id": rental["id"]})
        return tokens

    def _agents(self, base: str, tokens: dict[str, str]) -> list[subprocess.Popen[bytes]]:
        agents = []
        for n, node in enumerate(self.nodes):
            steps = [
                {"at": f.at, "gpu": f.index, **_fault(k, f)}
                for k, f in enumerate(self.failures)
                if f.node == node
            ]
            script = self.directory / f"faults-{node}.json"
            script.write_text(json.dumps(steps))
            token = self.directory / f"{node}.token"
            token.write_text(tokens[node])
            token.chmod(0o600)
            log = (self.directory / f"agent-{node}.log").open("wb")
            self.stack.callback(log.close)
            argv = [
                str(BIN / "gpumeter-agent"), "--server", base, "--token-file", str(token),
                "--spool-dir", str(self.directory / f"spool-{node}"), "--node-name", node,
                "--simulate", str(self.args.gpus_per_node), "--seed", str(n),
                "--faults", str(script), "--upload-interval", str(self.args.upload_interval),
            ]  # fmt: skip
            agent = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
            self.stack.callback(stop_child, agent, node)
            agents.append(agent)
        return agents

    def _measure(self, api: Api, orchestrator: Orchestrator, ended: int) -> dict[str, Any]:
        seen_failed = _first_event_times(orchestrator, "gpu.state_changed", "gpu_uuid")
        requested = {a.data["failed_gpu_uuid"]: a for a in orchestrator.events(REQUESTED)}
        resumes = orchestrator.resumed()
        credited = _credited_seconds(api)
        detection: list[float] = []
        request: list[float] = []
        degraded: list[float] = []
        rows: list[dict[str, Any]] = []
        for f in self.failures:
            failed_s = _first_second(api, f.gpu, ended, "degraded" if f.degraded else "failed")
            if failed_s is None:
                rows.append({"gpu": f.gpu, "failed": None})
                continue
            if f.degraded:
                rows.append(self._degraded_row(f, failed_s, requested, resumes, credited, degraded))
                continue
            if f.gpu in seen_failed:
                detection.append(seen_failed[f.gpu] - failed_s)
            arrival = requested.get(f.gpu)
            resume = resumes.get(str(arrival.data["failover_id"])) if arrival else None
            if arrival is not None:
                request.append(arrival.arrived_at - failed_s)
            expected = None if resume is None else resume.resumed_at - failed_s
            rows.append({"gpu": f.gpu, "expected_s": expected, "credited_s": credited[f.rental_id]})
        return self._result(detection, request, degraded, rows, orchestrator)

    def _degraded_row(
        self,
        f: Failure,
        degraded_s: int,
        requested: dict[str, Any],
        resumes: dict[str, Any],
        credited: dict[str, int],
        latencies: list[float],
    ) -> dict[str, Any]:
        """A degraded GPU's row: its credit (the migration window) against the expectation;
        the time from due to running on the spare appended to ``latencies``."""
        arrival = requested.get(f.gpu)
        resume = resumes.get(str(arrival.data["failover_id"])) if arrival else None
        if arrival is None or resume is None:
            return {"gpu": f.gpu, "expected_s": None, "credited_s": credited[f.rental_id]}
        latencies.append(resume.resumed_at - (degraded_s + self.args.degraded_after))
        decided = int(datetime.fromisoformat(arrival.data["failed_at"]).timestamp())
        expected = resume.resumed_at - decided
        return {"gpu": f.gpu, "expected_s": expected, "credited_s": credited[f.rental_id]}

    def _result(
        self,
        detection: list[float],
        request: list[float],
        degraded: list[float],
        rows: list[dict[str, Any]],
        orchestrator: Orchestrator,
    ) -> dict[str, Any]:
        expected = sum(r.get("expected_s") or 0 for r in rows)
        credited = sum(r.get("credited_s") or 0 for r in rows)
        exact = sum(1 for r in rows if r.get("expected_s") == r.get("credited_s"))
        figures = {
            "detection_p50_s": percentile(detection, 0.5),
            "detection_p99_s": percentile(detection, 0.99),
            "request_p50_s": percentile(request, 0.5),
            "request_p99_s": percentile(request, 0.99),
            "degraded_resume_p50_s": percentile(degraded, 0.5),
            "degraded_resume_p99_s": percentile(degraded, 0.99),
        }
        failed = len(self.failures) - self.args.degraded
        targets = {**TARGETS, **(DEGRADED_TARGETS if self.args.degraded else {})}
        counts = {
            **dict.fromkeys(TARGETS, failed),
            **dict.fromkeys(DEGRADED_TARGETS, self.args.degraded),
        }
        measured = {"detection_p99_s": detection, "request_p99_s": request,
                    "degraded_resume_p99_s": degraded}  # fmt: skip
        passed = {
            name: figures[name] is not None
            and len(measured[name]) == counts[name]
            and figures[name] <= limit  # type: ignore[operator]
            for name, limit in targets.items()
        }
        passed["credited_exact"] = exact == len(self.failures)
        return {
            "bench": "failover",
            "failures": failed,
            "degraded": self.args.degraded,
            "degraded_after_s": self.args.degraded_after,
            "failed_seen": len(detection),
            "requested": len(request),
            "resumed": len(orchestrator.resumed()),
            **figures,
            "resume_after_s": self.args.resume_after,
            "credited_s": credited,
            "expected_credited_s": expected,
            "rentals_credited_exactly": exact,
            "errors": orchestrator.errors[:5],
            "targets": {**targets, "credited_exact": True},
            "pass": passed,
            "ok": all(passed.values()),
            "loadavg_1m": round(os.getloadavg()[0], 2),
        }


def _iso(second: int) -> str:
    return from_epoch(second).isoformat()


def _first_event_times(orchestrator: Orchestrator, event_type: str, key: str) -> dict[str, float]:
    """Per GPU, when the service first published its change to ``failed`` (the event's time)."""
    first: dict[str, float] = {}
    for arrival in orchestrator.events(event_type):
        if arrival.data.get("to_state") != "failed":
            continue
        at = datetime.fromisoformat(arrival.event["timestamp"]).timestamp()
        gpu = arrival.data[key]
        first[gpu] = min(at, first.get(gpu, at))
    return first


def _fault(k: int, f: Failure) -> dict[str, Any]:
    faults = DEGRADED_FAULTS if f.degraded else FAULTS
    return faults[k % len(faults)]


def _first_second(api: Api, gpu: str, until: int, state: str) -> int | None:
    """The GPU's first second in ``state`` (failed or degraded) in the last hour."""
    timeline = api.get(f"/v1/gpus/{gpu}/timeline", start=until - 3600, end=until + 1)
    return min((s["start_s"] for s in timeline["segments"] if s["state"] == state), default=None)


def _credited_seconds(api: Api) -> dict[str, int]:
    """Per rental, the seconds of its invoice's credit lines."""
    seconds: dict[str, int] = defaultdict(int)
    for listed in api.get("/v1/invoices", limit=100)["items"]:
        for line in api.get(f"/v1/invoices/{listed['id']}")["lines"]:
            if line["kind"] in CREDIT_KINDS and line["rental_id"]:
                seconds[line["rental_id"]] += line["seconds"] or 0
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=4, help="agent processes")
    parser.add_argument("--gpus-per-node", type=int, default=32)
    parser.add_argument("--failures", type=int, default=52)
    parser.add_argument("--degraded", type=int, default=8, help="rented GPUs degraded for good")
    parser.add_argument(
        "--degraded-after", type=int, default=10, help="the plan moves a GPU degraded this long"
    )
    parser.add_argument("--spread", type=float, default=70.0, help="seconds the faults span")
    parser.add_argument("--resume-after", type=float, default=5.0, help="orchestrator's delay")
    parser.add_argument("--upload-interval", type=float, default=2.0)
    parser.add_argument("--price", default="2.49", help="per GPU-hour")
    parser.add_argument("--keep", type=Path, help="keep the logs and spools in this directory")
    args = parser.parse_args()
    started = time.monotonic()
    with ExitStack() as stack:
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
            directory = args.keep
        else:
            directory = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="failover-")))
        url = stack.enter_context(scratch_database(server_from_environment(), "gpumeter_failover"))
        result = Bench(args, directory, stack).run(url)
    result["wall_s"] = round(time.monotonic() - started, 1)
    print(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
