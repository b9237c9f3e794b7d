"""Accounting (``sacct --json -D``) is the record of truth for ended and requeued runs: a run
ends at the second accounting says, a job that ended while the adapter was away longer than
MinJobAge ends at its real end (not the last second seen), and what accounting cannot place
(runs the adapter never saw, a job nobody knows) is reported, never dropped."""

from __future__ import annotations

from typing import Any

from tests.slurm.conftest import SlurmWorld, gpu_of, job

ONE_GPU = {"n1": [0]}


def _run(start: int, end: int | None, state: str, *nodes: str) -> dict[str, Any]:
    return {"start": start, "end": end, "state": state, "nodes": list(nodes or ["n1"])}


def test_a_job_that_ended_while_the_adapter_was_away_ends_at_accountings_end(
    world: SlurmWorld,
) -> None:
    """Jobs 7 and 8 run; the adapter is away for an hour; slurmctld forgot both (MinJobAge).
    An incomplete snapshot lists them as missing; accounting has 7 (ended at +1200) and
    not 8, which is ended at the last second seen and reported."""
    t0 = world.t0
    world.snapshot(
        job(7, "RUNNING", start=t0, nodes=ONE_GPU),
        job(8, "RUNNING", start=t0, nodes={"n2": [1]}),
        at=t0 + 30,
    )
    result = world.snapshot(at=t0 + 4000, complete=False)
    assert (result["missing"], result["problems"]) == ([7, 8], [])
    accounted = job(7, "COMPLETED", start=t0, end=t0 + 1200) | {
        "runs": [_run(t0, t0 + 1200, "COMPLETED")]
    }
    answer = world.snapshot(accounted, at=t0 + 4001, complete=False, forgotten=[8])
    assert answer["missing"] == [] and answer["attributed"] == 1
    assert world.assignments(7) == [(gpu_of("n1", 0), t0, t0 + 1200)]
    [problem] = answer["problems"]
    assert (problem["job_id"], problem["reason"]) == (8, "vanished")
    assert world.assignments(8) == [(gpu_of("n2", 1), t0, t0 + 30)]
    assert world.snapshot(at=t0 + 4002, complete=False)["missing"] == []


def test_a_requeued_run_ends_when_accounting_says_not_at_the_requeue(world: SlurmWorld) -> None:
    """Preempted at +100 (accounting's end of the first run); Slurm's requeued record says
    submitted at +103 (a requeue's submit time lags the end by the time it took to settle)."""
    t0 = world.t0
    world.snapshot(job(7, "RUNNING", start=t0, nodes=ONE_GPU), at=t0 + 1)
    runs = [_run(t0, t0 + 100, "PREEMPTED"), _run(t0 + 110, None, "RUNNING", "n2")]
    rerun = job(7, "RUNNING", start=t0 + 110, restarts=1, submit=t0 + 103,
                nodes={"n2": [0]}) | {"runs": runs}  # fmt: skip
    assert world.snapshot(rerun, at=t0 + 111)["attributed"] == 1
    assert world.assignments(7) == [
        (gpu_of("n1", 0), t0, t0 + 100),
        (gpu_of("n2", 0), t0 + 110, None),
    ]


def test_runs_the_adapter_never_saw_are_reported_with_their_spans(world: SlurmWorld) -> None:
    """Requeued twice while the adapter was away: the middle run's GPUs are nowhere (sacct
    does not keep GRES indices), so it is reported with its times and nodes."""
    t0 = world.t0
    world.snapshot(job(7, "RUNNING", start=t0, nodes=ONE_GPU), at=t0 + 1)
    runs = [
        _run(t0, t0 + 100, "PREEMPTED"),
        _run(t0 + 110, t0 + 200, "NODE_FAIL", "n2"),
        _run(t0 + 210, None, "RUNNING", "n1"),
    ]
    rerun = job(7, "RUNNING", start=t0 + 210, restarts=2, submit=t0 + 205,
                nodes=ONE_GPU) | {"runs": runs}  # fmt: skip
    [problem] = world.snapshot(rerun, at=t0 + 211)["problems"]
    assert problem["reason"] == "unseen_runs"
    assert f"{t0 + 110}-{t0 + 200} on n2" in problem["detail"]
    assert world.assignments(7) == [
        (gpu_of("n1", 0), t0, t0 + 100),
        (gpu_of("n1", 0), t0 + 210, None),
    ]


def test_a_job_cancelled_in_the_second_it_began_bills_nothing_and_frees_its_gpu(
    world: SlurmWorld,
) -> None:
    """Seen running in its first second, job 7 is not attributed yet (it may end in that very
    second, and a rental cannot last no second): the adapter is asked to send it again. It
    was cancelled in that second: no rental, no problem, and job 8 gets the GPU at once."""
    t0 = world.t0
    first = world.snapshot(job(7, "RUNNING", start=t0, nodes=ONE_GPU), at=t0)
    assert (first["too_new"], first["attributed"], first["problems"]) == ([7], 0, [])
    cancelled = job(7, "CANCELLED", start=t0, end=t0) | {"runs": [_run(t0, t0, "CANCELLED")]}
    later = world.snapshot(cancelled, job(8, "RUNNING", start=t0, nodes=ONE_GPU), at=t0 + 1)
    assert (later["too_new"], later["attributed"], later["problems"]) == ([], 1, [])
    assert world.job_row(7)["rental_id"] is None and world.job_row(7)["ended_at"] is not None
    assert world.assignments(8) == [(gpu_of("n1", 0), t0, None)]


def test_a_run_requeued_in_the_second_it_began_holds_its_gpus_for_no_second(
    world: SlurmWorld,
) -> None:
    """A higher-priority job preempted job 7 in the second it began, and a snapshot read in
    that second attributed the run. Accounting has the run ending where it began: its GPUs
    are withdrawn, not left held from that second on (they were, and every later job on them
    was refused: the workload test's intermittent 30-s wait), and job 8, which took them in
    that second, is attributed."""
    start = world.t0
    world.snapshot(job(7, "RUNNING", start=start, nodes=ONE_GPU), at=start + 1)
    requeued = job(7, "PENDING", start=start + 300, restarts=1, submit=start) | {
        "runs": [_run(start, start, "PREEMPTED")]
    }
    taker = job(8, "RUNNING", start=start, nodes=ONE_GPU)
    result = world.snapshot(requeued, taker, at=start + 2)
    assert (result["attributed"], result["problems"]) == (2, [])
    assert world.assignments(7) == []
    assert world.assignments(8) == [(gpu_of("n1", 0), start, None)]
