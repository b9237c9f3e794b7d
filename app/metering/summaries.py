"""Closed hours' summaries, computed after the hour's turn rather than at it.

At an hour's turn every GPU's open row closes in the same upload round; ingest copies them to
the closed table in SQL (``repository.open_hours_roll_statement``), raw and with their idle
floor unknown (``idle.UNSUMMARISED``: idle reads scan such an hour instead of skipping it).
This job, every minute, deflates a bounded number of them (``packing.stored``) and stores
their floor, the Python work ingest would otherwise do for every GPU in that one round.
"""

from __future__ import annotations

import logging

import procrastinate
from procrastinate import job_context
from sqlalchemy.orm import Session

from app.core.db import transaction
from app.metering import repository

log = logging.getLogger(__name__)

# ~50 µs of Python a row (0.26 s for a run of 5,000 busy hours, measured): a run takes well
# under a second of one core, and a fleet of 16,000 GPUs is summarised within four minutes of
# the hour's turn.
HOURS_PER_RUN = 5_000

tasks = procrastinate.Blueprint()


def summarise(session: Session, limit: int = HOURS_PER_RUN) -> int:
    """Summarise up to ``limit`` closed hours, oldest first; how many."""
    raw = repository.unsummarised_hours(session, limit)
    if raw:
        repository.summarise_hours(session, raw)
    return len(raw)


@tasks.periodic(cron="* * * * *")
@tasks.task(name="summaries", queueing_lock="metering_summaries", pass_context=True)
def summarise_closed_hours(context: job_context.JobContext, timestamp: int) -> int:
    """Every minute: deflate and summarise the hours closed at the last hour's turn."""
    with transaction(context.additional_context["engine"]) as session:
        done = summarise(session)
    if done:
        log.info("closed hours summarised", extra={"hours": done})
    return done
