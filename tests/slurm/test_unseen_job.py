"""A job that began and ended between two of the adapter's rounds (a one-second job on a spare
the moment a failover let it go, killed by the failed-over job's preemption) is first seen
holding no GPUs: accounting's run of it is reported, never dropped."""

from __future__ import annotations

from tests.slurm.conftest import SlurmWorld, job


def test_a_job_first_seen_ended_with_a_run_in_accounting_is_reported(world: SlurmWorld) -> None:
    t0 = world.t0
    run = {"start": t0 + 5, "end": t0 + 6, "state": "PREEMPTED", "nodes": ["n3"]}
    killed = job(9, "PREEMPTED", start=t0 + 5, end=t0 + 6) | {"runs": [run]}
    [problem] = world.snapshot(killed, at=t0 + 7)["problems"]
    assert (problem["job_id"], problem["reason"]) == (9, "unseen_runs")
    assert f"{t0 + 5}-{t0 + 6} on n3" in problem["detail"]
    row = world.job_row(9)
    assert row["rental_id"] is None and row["ended_at"] is not None
    [event] = world.events("slurm.job_unattributed")
    assert (event["data"]["job_id"], event["data"]["reason"]) == (9, "unseen_runs")


def test_a_job_cancelled_while_pending_is_no_problem(world: SlurmWorld) -> None:
    """Its accounting record has no run (never started): nothing to report, no row."""
    t0 = world.t0
    cancelled = job(9, "CANCELLED", start=None, submit=t0, end=t0 + 6) | {"runs": []}
    assert world.snapshot(cancelled, at=t0 + 7)["problems"] == []
    assert world.get("/v1/slurm/jobs?limit=1000")["items"] == []
