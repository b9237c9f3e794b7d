"""The summaries job: hours closed at an hour's turn, raw and unsummarised, are deflated and
given their idle floor, a bounded number a run, oldest first, skipping rows being written."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from sqlalchemy import Engine, text

from app.core import queue
from app.core.db import transaction
from app.metering import idle, packing, summaries
from tests.metering.conftest import Agent, minute_ago, rec


def _closed(db: Engine) -> dict[tuple[str, int], tuple[int, int | None]]:
    """(GPU, hour) -> the stored row's length and idle floor."""
    with transaction(db) as session:
        rows = session.execute(
            text("SELECT gpu_uuid, hour, length(slots), util_min_tenths FROM gpu_minute_metrics")
        ).all()
    return {(gpu, hour): (size, floor) for gpu, hour, size, floor in rows}


def _turn_hours(agent: Agent, gpus: list[str], hours: list[int]) -> None:
    """A minute of each GPU in each hour, one upload an hour: each upload closes the GPUs'
    open rows of the hour before at the turn."""
    for hour in hours:
        agent.post(
            [rec(gpu, hour, hour + 60, gpu_util_mean=float(g)) for g, gpu in enumerate(gpus)]
        )


def test_the_job_summarises_a_bounded_number_oldest_first_and_is_registered_every_minute(
    agent: Agent, db: Engine
) -> None:
    gpus = ["GPU-0", "GPU-1"]
    first = packing.hour_of(minute_ago(0)) - 3 * packing.HOUR
    _turn_hours(agent, gpus, [first, first + packing.HOUR, first + 2 * packing.HOUR])
    raw = packing.ROW_BYTES
    assert _closed(db) == {
        (gpu, hour): (raw, idle.UNSUMMARISED)
        for gpu in gpus
        for hour in (first, first + packing.HOUR)
    }
    with transaction(db) as session:
        assert summaries.summarise(session, limit=3) == 3
    after = _closed(db)
    assert {key for key, (_, floor) in after.items() if floor == idle.UNSUMMARISED} <= {
        (gpu, first + packing.HOUR) for gpu in gpus
    }
    context: Any = SimpleNamespace(additional_context={"engine": db})
    assert summaries.summarise_closed_hours(context, timestamp=0) == 1
    assert summaries.summarise_closed_hours(context, timestamp=0) == 0
    after = _closed(db)
    # GPU-n's one minute was n % busy: floor n x 10 tenths; deflated far below the raw row.
    assert {key: floor for key, (_, floor) in after.items()} == {
        (gpu, hour): 10 * g for g, gpu in enumerate(gpus) for hour in (first, first + packing.HOUR)
    }
    assert max(size for size, _ in after.values()) < raw // 4
    task = queue.queue.tasks["metering_summaries:summaries"]
    assert task.queueing_lock == "metering_summaries"
    crons = [
        p.cron for p in queue.queue.periodic_registry.periodic_tasks.values() if p.task is task
    ]
    assert crons == ["* * * * *"]


def test_a_row_being_written_is_skipped_not_overwritten(agent: Agent, db: Engine) -> None:
    """The job never overwrites a closed hour that a late record is being combined into: it
    skips the locked row, and summarises it on a later run."""
    hour = packing.hour_of(minute_ago(0)) - 2 * packing.HOUR
    _turn_hours(agent, ["GPU-0"], [hour, hour + packing.HOUR])
    with db.connect() as writer:
        writer.execute(
            text("UPDATE gpu_minute_metrics SET mem_total_mib = 1 WHERE hour = :h"), {"h": hour}
        )
        with transaction(db) as session:
            assert summaries.summarise(session) == 0
        writer.commit()
    with transaction(db) as session:
        assert summaries.summarise(session) == 1
    assert _closed(db)[("GPU-0", hour)][1] == 0
