"""Slurm jobs become rentals from the scheduler's own records: the exact GPUs, from the run's
start second, requeues and ends closing assignments at the second Slurm says, snapshots
idempotent and a missed one caught up; what cannot be attributed is reported with its reason."""

from __future__ import annotations

from prometheus_client import REGISTRY

from tests.slurm.conftest import ACCOUNT, CLUSTER, SlurmWorld, gpu_of, job

TWO_NODES = {"n1": [0, 1], "n2": [0, 1]}


def test_a_running_job_becomes_one_rental_of_exactly_its_gpus(world: SlurmWorld) -> None:
    start = world.t0
    result = world.snapshot(job(7, "RUNNING", start=start, nodes=TWO_NODES), at=start + 5)
    assert result == {"attributed": 1, "unchanged": 0, "deferred": 0, "problems": [], "missing": [],
                      "too_new": []}  # fmt: skip
    row = world.job_row(7)
    assert (row["cluster"], row["account"], row["restarts"], row["nodes"]) == (
        CLUSTER, ACCOUNT, 0, ["n1", "n2"],
    )  # fmt: skip
    rental = world.get(f"/v1/rentals/{row['rental_id']}")
    assert (rental["customer_id"], rental["gpu_count"], rental["gpu_model"], rental["name"]) == (
        world.customer_id, 4, "H100", "slurm job 7",
    )  # fmt: skip
    expected = [(gpu_of(n, i), start, None) for n in ("n1", "n2") for i in (0, 1)]
    assert world.assignments(7) == expected
    # The same record again, and again later: nothing attributed twice.
    again = world.snapshot(job(7, "RUNNING", start=start, nodes=TWO_NODES), at=start + 9)
    assert (again["attributed"], again["unchanged"]) == (0, 1)
    assert world.assignments(7) == expected
    assert len(world.get("/v1/rentals?limit=100")["items"]) == 1


def test_a_requeue_ends_the_run_at_the_requeue_second_and_the_next_begins_at_its_start(
    world: SlurmWorld,
) -> None:
    start = world.t0
    world.snapshot(job(7, "RUNNING", start=start, nodes=TWO_NODES), at=start + 1)
    # scontrol requeue: for a moment COMPLETING with the new restart count and the old
    # submit time (a guess of an end): nothing is decided on it.
    settling = job(7, "COMPLETING", start=start, restarts=1, submit=start - 1, end=start + 999)
    assert world.snapshot(settling, at=start + 100)["unchanged"] == 1
    pending = job(7, "PENDING", start=start + 220, restarts=1, submit=start + 100)
    world.snapshot(pending, at=start + 101)
    ended_at_requeue: list[tuple[str, int | None, int | None]] = [
        (gpu_of(n, i), start, start + 100) for n in ("n1", "n2") for i in (0, 1)
    ]
    assert world.assignments(7) == ended_at_requeue
    rerun = job(7, "RUNNING", start=start + 103, restarts=1, submit=start + 100,
                nodes={"n2": [0, 1], "n3": [0, 1]})  # fmt: skip
    assert world.snapshot(rerun, at=start + 104)["attributed"] == 1
    second_run: list[tuple[str, int | None, int | None]] = [
        (gpu_of(n, i), start + 103, None) for n in ("n2", "n3") for i in (0, 1)
    ]
    assert world.assignments(7) == sorted(ended_at_requeue + second_run)
    assert world.job_row(7)["nodes"] == ["n2", "n3"]


def test_a_missed_poll_is_caught_up_from_slurms_record(world: SlurmWorld) -> None:
    start = world.t0
    world.snapshot(job(7, "RUNNING", start=start, nodes={"n1": [0, 1]}), at=start + 1)
    # The pending moment of a requeue was never seen: the record still tells both seconds.
    rerun = job(7, "RUNNING", start=start + 50, restarts=1, submit=start + 47,
                nodes={"n2": [1]})  # fmt: skip
    world.snapshot(rerun, at=start + 60)
    assert world.assignments(7) == [
        (gpu_of("n1", 0), start, start + 47),
        (gpu_of("n1", 1), start, start + 47),
        (gpu_of("n2", 1), start + 50, None),
    ]
    # A job that started and ended between two polls is attributed whole.
    done = job(8, "COMPLETED", start=start + 10, end=start + 70, nodes={"n3": [0]})
    assert world.snapshot(done, at=start + 80)["attributed"] == 1
    assert world.assignments(8) == [(gpu_of("n3", 0), start + 10, start + 70)]
    assert world.get(f"/v1/rentals/{world.job_row(8)['rental_id']}")["end_at"] is not None


def test_the_jobs_end_ends_its_rental_at_slurms_end_second(world: SlurmWorld) -> None:
    start = world.t0
    world.snapshot(job(7, "RUNNING", start=start, nodes=TWO_NODES), at=start + 1)
    world.snapshot(job(7, "COMPLETED", start=start, end=start + 90, nodes=TWO_NODES), at=start + 95)
    assert {end for _, _, end in world.assignments(7)} == {start + 90}
    row = world.job_row(7)
    rental = world.get(f"/v1/rentals/{row['rental_id']}")
    assert rental["end_at"] == row["ended_at"]
    # Seen again (slurmctld keeps it for MinJobAge): nothing changes.
    again = world.snapshot(job(7, "COMPLETED", start=start, end=start + 90), at=start + 99)
    assert again["unchanged"] == 1


def test_a_job_gone_from_slurms_records_ends_at_the_last_second_seen(world: SlurmWorld) -> None:
    start = world.t0
    world.snapshot(job(7, "RUNNING", start=start, nodes={"n1": [0]}), at=start + 30)
    result = world.snapshot(at=start + 4000)
    [problem] = result["problems"]
    assert (problem["job_id"], problem["reason"]) == (7, "vanished")
    assert world.assignments(7) == [(gpu_of("n1", 0), start, start + 30)]
    # An incomplete snapshot (one job asked for) ends nothing.
    world.snapshot(job(8, "RUNNING", start=start, nodes={"n2": [0]}), at=start + 31)
    world.snapshot(at=start + 4000, complete=False)
    assert world.assignments(8) == [(gpu_of("n2", 0), start, None)]


def _problem_count(reason: str) -> float:
    value = REGISTRY.get_sample_value("gpumeter_slurm_job_problems_total", {"reason": reason})
    return value or 0.0


def test_an_unknown_account_is_reported_once_and_attributed_once_mapped(
    world: SlurmWorld,
) -> None:
    start, before = world.t0, _problem_count("unknown_account")
    orphan = job(9, "RUNNING", start=start, nodes={"n1": [0]}, account="physics")
    for at in (start + 1, start + 2):
        [problem] = world.snapshot(orphan, at=at)["problems"]
        assert problem["reason"] == "unknown_account"
        assert "PUT /v1/slurm/accounts/physics" in problem["detail"]
    assert _problem_count("unknown_account") == before + 1  # counted once per cause
    [event] = world.events("slurm.job_unattributed")
    assert event["data"]["reason"] == "unknown_account"
    assert world.job_row(9)["rental_id"] is None
    mapping = {"customer_id": world.customer_id, "plan_id": world.plan_id}
    response = world.client.put("/v1/slurm/accounts/physics", json=mapping,
                                headers=world.console.headers)  # fmt: skip
    assert response.status_code == 200, response.text
    assert world.snapshot(orphan, at=start + 3)["attributed"] == 1
    assert world.assignments(9) == [(gpu_of("n1", 0), start, None)]  # from Slurm's start
    assert world.job_row(9)["problem"] is None


def test_a_node_or_gpu_index_without_a_reported_uuid_is_a_reported_problem(
    world: SlurmWorld,
) -> None:
    start = world.t0
    stranger = job(10, "RUNNING", start=start, nodes={"n1": [0], "login-7": [0]})
    [problem] = world.snapshot(stranger, at=start + 1)["problems"]
    assert problem["reason"] == "unknown_node"
    assert "'login-7' is not a gpumeter node" in problem["detail"]
    beyond = job(11, "RUNNING", start=start, nodes={"n2": [1, 5]})
    [problem] = world.snapshot(beyond, at=start + 1)["problems"]
    assert problem["reason"] == "unknown_gpu_index"
    assert "[5]" in problem["detail"] and "reported: [0, 1]" in problem["detail"]
    assert [j["rental_id"] for j in world.get("/v1/slurm/jobs")["items"]] == [None, None]
    assert world.get("/v1/rentals")["items"] == []  # nothing half-attributed


def test_bad_mappings_and_snapshots_are_clear_4xx(world: SlurmWorld) -> None:
    headers = world.console.headers
    missing = {"customer_id": "00000000-0000-0000-0000-000000000001", "plan_id": world.plan_id}
    response = world.client.put("/v1/slurm/accounts/x", json=missing, headers=headers)
    assert response.status_code == 404
    assert "customer" in response.json()["detail"][0]["msg"]
    euro = world.console.customer("Euro GmbH", currency="EUR")["id"]
    response = world.client.put(
        "/v1/slurm/accounts/x", json={"customer_id": euro, "plan_id": world.plan_id},
        headers=headers,
    )  # fmt: skip
    assert response.status_code == 422
    assert "priced in USD" in response.json()["detail"][0]["msg"]
    bad = job(0, "RUNNING", start=world.t0, account="has space")
    body = world.snapshot(bad, at=world.t0, status=422)
    locs = {tuple(item["loc"]) for item in body["detail"]}
    assert ("body", "jobs", 0, "job_id") in locs
    assert ("body", "jobs", 0, "account") in locs
    assert world.client.get("/v1/slurm/actions", headers=headers).status_code == 422  # cluster
