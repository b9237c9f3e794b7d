"""The adapter's rounds against the real service (in process), over a scripted Slurm: the job
listings, accounting and node states a cluster would give, and every command the adapter gives
it recorded. What a real cluster cannot show on demand (a requeue read in its first moment while
accounting lags, a reboot of a ``slurmd -N`` node) is scripted here; tests/e2e/test_slurm.py
runs the same adapter against a real slurmctld."""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from app.core.console_client import Api
from app.core.epoch import from_epoch
from app.slurm.adapter import Adapter, AdapterConfig
from app.slurm.scheduler import SlurmJob
from app.slurm.schemas import AccountedRun, JobObservation, NodeGpus
from metering_agent.healthcheck import NodeStatus
from tests.slurm.conftest import ACCOUNT, CLUSTER, SlurmWorld, gpu_of

IDLE = NodeStatus(frozenset({"IDLE"}), "")
USER = "alice"  # every job's user


@dataclass
class ScriptedSlurm:
    """What the adapter reads of Slurm this round, and what it told Slurm to do."""

    listing: list[JobObservation] = field(default_factory=list)
    accounted: dict[int, JobObservation] = field(default_factory=dict)
    status: dict[str, NodeStatus] = field(default_factory=dict)
    commands: list[tuple[str, ...]] = field(default_factory=list)
    holds: set[str] = field(default_factory=set)  # the failovers' reservations
    reserved: list[str] = field(default_factory=list)  # the spare reservation's nodes

    def jobs(self) -> list[SlurmJob]:
        return [SlurmJob(o, partition="gpu", user=USER) for o in self.listing]

    def job(self, job_id: int) -> SlurmJob | None:
        return next((job for job in self.jobs() if job.job_id == job_id), None)

    def accounting(self, job_ids: Collection[int]) -> dict[int, JobObservation]:
        return {i: job for i, job in self.accounted.items() if i in job_ids}

    def nodes(self) -> list[str]:
        return ["n1", "n2", "n3"]

    def node_status(self, node: str) -> NodeStatus:
        return self.status.get(node, IDLE)

    def drain(self, node: str, reason: str) -> None:
        self.commands.append(("drain", node, reason))
        self.status[node] = NodeStatus(frozenset({"IDLE", "DRAIN"}), reason)

    def reboot(self, node: str, reason: str) -> None:
        self.commands.append(("reboot", node, reason))
        self.status[node] = NodeStatus(frozenset({"IDLE", "DRAIN", "REBOOT_REQUESTED"}), reason)

    def hold_nodes(self, name: str, nodes: list[str]) -> None:
        self.reserved = nodes  # on a real slurmctld: tests/e2e/test_slurm.py

    def requeue(self, job_id: int) -> None:
        """The job pending again at once, its restart count one up, holding nothing."""
        self.commands.append(("requeue", str(job_id)))
        self.listing = [
            o.model_copy(update={"state": "PENDING", "restarts": o.restarts + 1,
                                 "start_time": None, "allocation": []})
            if o.job_id == job_id else o
            for o in self.listing
        ]  # fmt: skip

    def hold_for(self, reservation: str, nodes: list[str], user: str) -> None:
        if reservation not in self.holds:  # as Slurm's: kept if it exists
            self.commands.append(("hold", reservation, user, *nodes))
            self.holds.add(reservation)

    def place(self, job_id: int, nodes: list[str], reservation: str, user: str) -> None:
        self.hold_for(reservation, nodes, user)
        self.commands.append(("place", str(job_id), reservation, *nodes))

    def let_go(self, reservation: str, job_id: int) -> None:
        if reservation in self.holds:  # as Slurm's: nothing to end once it is gone
            self.commands.append(("let_go", reservation, str(job_id)))
            self.holds.remove(reservation)

    def unpin(self, job_id: int) -> None:
        self.commands.append(("unpin", str(job_id)))


def _adapter(world: SlurmWorld, client: TestClient, slurm: ScriptedSlurm) -> Adapter:
    api = Api("http://testserver", "unused")
    api.client = httpx.Client(
        transport=client._transport, base_url="http://testserver", headers=world.console.headers
    )
    return Adapter(api, slurm, AdapterConfig(cluster=CLUSTER))  # type: ignore[arg-type]


def _observed(
    state: str, *, start: int | None, restarts: int = 0, submit: int, end: int | None = None,
    gpus: dict[str, list[int]] | None = None, runs: list[AccountedRun] | None = None,
) -> JobObservation:  # fmt: skip
    return JobObservation(
        job_id=7, account=ACCOUNT, state=state, restarts=restarts, submit_time=submit,
        start_time=start, end_time=end, runs=runs,
        allocation=[NodeGpus(node=n, gpu_indices=ix) for n, ix in (gpus or {}).items()],
    )  # fmt: skip


def test_a_requeue_read_in_its_first_moment_ends_the_run_at_accountings_end(
    world: SlurmWorld, client: TestClient
) -> None:
    """Job 7 runs on n1's GPU 0 from t0; preempted at +4 and requeued. Under load the adapter's
    next round reads it in the moment of the requeue: restart count 1, its submit time still
    the first one, and accounting not yet told the first run ended. Then it runs again on the
    same GPU from +129. The first run ends at +4 (accounting's), the second begins at +129: the
    GPU's first assignment does not run on into the second run."""
    t0, first = world.t0, {"n1": [0]}
    slurm = ScriptedSlurm(listing=[_observed("RUNNING", start=t0, submit=t0 - 2, gpus=first)])
    adapter = _adapter(world, client, slurm)
    adapter.round()
    assert world.assignments(7) == [(gpu_of("n1", 0), t0, None)]

    slurm.listing = [_observed("PENDING", start=t0 + 125, restarts=1, submit=t0 - 2)]
    lagging = [AccountedRun(start=t0, end=None, nodes=["n1"], state="RUNNING")]
    slurm.accounted = {7: _observed("RUNNING", start=t0, submit=t0 - 2, runs=lagging)}
    adapter.round()
    slurm.listing = [
        _observed("RUNNING", start=t0 + 129, restarts=1, submit=t0 + 4, gpus=first)
    ]  # fmt: skip
    runs = [
        AccountedRun(start=t0, end=t0 + 4, nodes=["n1"], state="PREEMPTED"),
        AccountedRun(start=t0 + 129, end=None, nodes=["n1"], state="RUNNING"),
    ]
    slurm.accounted = {7: _observed("RUNNING", start=t0 + 129, restarts=1, submit=t0 + 4,
                                    runs=runs)}  # fmt: skip
    adapter.round()
    assert world.assignments(7) == [
        (gpu_of("n1", 0), t0, t0 + 4),
        (gpu_of("n1", 0), t0 + 129, None),
    ]
    assert world.job_row(7)["problem"] is None


def _fail_under_job_7(world: SlurmWorld) -> dict[str, Any]:
    """Job 7 runs on n1's two GPUs; GPU 0 falls off the bus at +30: a failover action."""
    t0 = world.t0
    world.snapshot(
        {"job_id": 7, "account": ACCOUNT, "state": "RUNNING", "restarts": 0,
         "submit_time": t0 - 1, "start_time": t0,
         "allocation": [{"node": "n1", "gpu_indices": [0, 1]}]},
        at=t0 + 1,
    )  # fmt: skip
    event = {"event_id": "xid", "gpu_uuid": gpu_of("n1", 0), "at": t0 + 30, "kind": "xid",
             "code": 79, "rule": "xid_79_fallen_off_bus"}  # fmt: skip
    records = [
        {"gpu_uuid": gpu_of("n1", 0), "model": "H100", "start": a, "end": b, "state": s,
         "sample_count": b - a, "device_index": 0}
        for a, b, s in ((t0, t0 + 30, "healthy"), (t0 + 30, t0 + 60, "failed"))
    ]  # fmt: skip
    world.agents["n1"].post(records, [event])
    [action] = world.get(f"/v1/slurm/actions?cluster={CLUSTER}")["items"]
    return dict(action)


def _drained_by_a_failover(world: SlurmWorld, slurm: ScriptedSlurm) -> dict[str, Any]:
    """The failover's action done: n1 drained by gpumeter, its job moved."""
    action = _fail_under_job_7(world)
    slurm.drain("n1", action["reason"])
    world.console.post(f"/v1/slurm/actions/{action['id']}/done", {"outcome": "moved"}, 200)
    return action


def _repair(world: SlurmWorld) -> None:
    world.report("n1", [(0, world.t0 + 60, world.t0 + 61, "healthy")])


def test_a_repaired_node_is_rebooted_then_resumed_never_resumed_at_once(
    world: SlurmWorld, client: TestClient
) -> None:
    slurm = ScriptedSlurm()
    _drained_by_a_failover(world, slurm)
    _repair(world)
    [repair] = world.get(f"/v1/slurm/actions?cluster={CLUSTER}")["items"]
    _adapter(world, client, slurm).round()
    reason = f"gpumeter: GPU {gpu_of('n1', 0)} healthy again; reboot, then resume"
    assert slurm.commands[-1] == ("reboot", "n1", reason)
    assert [c for c in slurm.commands if c[0] == "resume"] == []
    done = world.get(f"/v1/slurm/actions?cluster={CLUSTER}")["items"]
    assert done == []
    assert world.get("/v1/slurm/layout")["drained_nodes"] == []
    assert repair["node"] == "n1"


@pytest.mark.parametrize(
    ("status", "outcome"),
    [
        (NodeStatus(frozenset({"IDLE", "DRAIN"}), "fan swap"),
         "node n1 left drained: not gpumeter's (fan swap)"),
        (NodeStatus(frozenset({"IDLE", "DRAIN"}), "gpumeter-healthcheck: GPU x failed"),
         "node n1 left drained: not gpumeter's (gpumeter-healthcheck: GPU x failed)"),
    ],
)  # fmt: skip
def test_a_node_drained_by_someone_else_is_neither_drained_over_nor_rebooted(
    world: SlurmWorld,
    client: TestClient,
    caplog: pytest.LogCaptureFixture,
    status: NodeStatus,
    outcome: str,
) -> None:
    """An operator (or the node's health check) drained n1 with a reason of their own before
    its GPU failed: the failover leaves their drain and reason, and the repair leaves n1
    drained, saying why."""
    slurm = ScriptedSlurm(status={"n1": status})
    _fail_under_job_7(world)
    adapter = _adapter(world, client, slurm)
    adapter.round()  # the job ended meanwhile (not listed): the failover is given up
    assert slurm.commands == [] and slurm.status["n1"] == status
    _repair(world)
    [repair] = world.get(f"/v1/slurm/actions?cluster={CLUSTER}")["items"]
    caplog.set_level("INFO", logger="app.slurm.adapter")
    adapter.round()
    assert world.get(f"/v1/slurm/actions?cluster={CLUSTER}")["items"] == []
    done = [r for r in caplog.records if r.getMessage() == "slurm_action_done"]
    assert [(r.action, r.outcome) for r in done] == [(repair["id"], outcome)]  # type: ignore[attr-defined]
    assert slurm.commands == [] and slurm.status["n1"] == status


def test_a_node_resumed_by_hand_while_gpumeter_held_it_failed_is_reported_once(
    world: SlurmWorld, client: TestClient
) -> None:
    """gpumeter drained n1 for its failed GPU 0; an operator resumed it before any repair:
    the adapter reports it, the service records it as n1's repair (so a later healthy report
    does not reboot it) and publishes it once; n1 is not drained again."""
    slurm = ScriptedSlurm()
    action = _drained_by_a_failover(world, slurm)
    adapter = _adapter(world, client, slurm)
    assert world.get("/v1/slurm/layout")["drained_nodes"] == ["n1"]
    adapter.round()  # still drained: nothing to report
    assert world.events("slurm.node_resumed_by_hand") == []
    slurm.status["n1"] = NodeStatus(frozenset({"IDLE"}), "")  # scontrol update state=resume
    adapter.round()
    adapter.round()
    [event] = world.events("slurm.node_resumed_by_hand")
    assert event["data"] == {
        "cluster": CLUSTER, "node": "n1", "state": "IDLE", "failover_id": action["failover_id"],
        "failed_gpu_uuids": [gpu_of("n1", 0)],
    }  # fmt: skip
    assert world.get("/v1/slurm/layout")["drained_nodes"] == []
    assert [c for c in slurm.commands if c[0] in ("drain", "reboot")] == [
        ("drain", "n1", action["reason"])
    ]
    _repair(world)  # healthy again: nothing left to do, no reboot of a node in service
    assert world.get(f"/v1/slurm/actions?cluster={CLUSTER}")["items"] == []


def _sent_snapshots(adapter: Adapter) -> list[tuple[bool, list[int]]]:
    """(delta, job ids) of each snapshot the adapter posts from now on."""
    sent: list[tuple[bool, list[int]]] = []

    def record(request: httpx.Request) -> None:
        if request.url.path == "/v1/slurm/snapshots":
            body = json.loads(request.content)
            sent.append((body["delta"], sorted(job["job_id"] for job in body["jobs"])))

    adapter.api.client.event_hooks["request"].append(record)
    return sent


def _round(adapter: Adapter) -> None:
    """One round, counted as ``Adapter.run`` counts it (every ``FULL_EVERY``-th round sends
    the whole listing, the others what changed)."""
    adapter.round()
    adapter.rounds += 1


def test_a_job_refused_for_a_passing_cause_is_attributed_from_its_start_once_it_passes(
    world: SlurmWorld, client: TestClient
) -> None:
    """Since t0, job 9 runs under an account mapped to no customer, job 10 on n4, whose agent
    has not reported its GPUs yet, job 11 on a MIG slice (never billed) and job 12 as it
    should. Slurm's records of them do not change, yet each round sends jobs 9 and 10 again
    (not 11, refused for good, nor 12): the first round after the account is mapped and n4's
    agent reports attributes both from t0, their start."""
    t0 = world.t0
    world.node("n4", report=False)

    def running(job_id: int, account: str, held: NodeGpus) -> JobObservation:
        return JobObservation(job_id=job_id, account=account, state="RUNNING", restarts=0,
                              submit_time=t0 - 1, start_time=t0, allocation=[held])  # fmt: skip

    slurm = ScriptedSlurm(listing=[
        running(9, "physics", NodeGpus(node="n1", gpu_indices=[1])),
        running(10, ACCOUNT, NodeGpus(node="n4", gpu_indices=[0])),
        running(11, ACCOUNT, NodeGpus(node="n2", gpu_indices=[], mig=["gpu:1g.10gb:1"])),
        running(12, ACCOUNT, NodeGpus(node="n1", gpu_indices=[0])),
    ])  # fmt: skip
    adapter = _adapter(world, client, slurm)
    sent = _sent_snapshots(adapter)
    _round(adapter)
    _round(adapter)
    assert sent == [(False, [9, 10, 11, 12]), (True, [9, 10])]
    problems = {row["job_id"]: row["problem"] for row in world.get("/v1/slurm/jobs")["items"]}
    assert [(job_id, (problem or "").split(":")[0]) for job_id, problem in problems.items()] == [
        (9, "unknown_account"), (10, "unknown_gpu_index"), (11, "mig_unsupported"), (12, ""),
    ]  # fmt: skip

    world.map_account("physics")
    world.report("n4", [(0, t0 + 30, t0 + 31, "healthy")])
    _round(adapter)
    assert sent[2:] == [(True, [9, 10])]
    assert world.assignments(9) == [(gpu_of("n1", 1), t0, None)]
    assert world.assignments(10) == [(gpu_of("n4", 0), t0, None)]
    assert [world.job_row(job_id)["problem"] for job_id in (9, 10)] == [None, None]
    _round(adapter)
    assert sent[3:] == [(True, [])]  # attributed: nothing more to send


def test_a_failed_over_job_holds_its_nodes_until_it_runs_there(
    world: SlurmWorld, client: TestClient
) -> None:
    """Job 7's GPU on n1 fails: the adapter drains n1, holds n3 (the spare's node) in a
    reservation of the job's user, requeues the job and places it on n3 in that reservation;
    n3 stays in the spare reservation meanwhile, so no other job starts there. Once job 7
    runs on n3, its reservation ends and the failover is resumed: n3 serves the job and
    leaves the spares."""
    action = _fail_under_job_7(world)
    t0 = world.t0
    slurm = ScriptedSlurm(
        listing=[_observed("RUNNING", start=t0, submit=t0 - 1, gpus={"n1": [0, 1]})]
    )
    adapter = _adapter(world, client, slurm)
    adapter.round()
    hold = f"gpumeter_spares_failover{action['id']}"
    assert slurm.commands == [
        ("drain", "n1", action["reason"]),
        ("hold", hold, USER, "n3"),  # before the requeue lets the job's nodes go
        ("requeue", "7"),
        ("place", "7", hold, "n3"),
    ]
    assert slurm.holds == {hold} and slurm.reserved == ["n3"]  # held twice over

    slurm.listing = [
        _observed("RUNNING", start=t0 + 40, restarts=1, submit=t0 + 32, gpus={"n3": [0, 1]})
    ]
    adapter.round()
    assert slurm.commands[4:] == [("drain", "n1", action["reason"]), ("let_go", hold, "7")]
    assert slurm.holds == set() and slurm.reserved == []
    [resumed] = world.get("/v1/failovers?state=resumed")["items"]
    assert datetime.fromisoformat(resumed["resumed_at"]) == from_epoch(t0 + 40)
