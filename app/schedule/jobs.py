"""The periodic jobs: the scheduled invoice run (``GPUMETER_INVOICE_SCHEDULE_CRON``) and the
usage rollups' store (``GPUMETER_ROLLUP_SCHEDULE_CRON``)."""

from __future__ import annotations

from datetime import UTC, datetime

import procrastinate
from procrastinate import job_context

from app.billing.usage import UsageSettings
from app.schedule.service import store_rollups, tick
from app.settings import get_settings

tasks = procrastinate.Blueprint()


@tasks.periodic(cron=get_settings().invoice_schedule_cron)
@tasks.task(name="tick", queueing_lock="invoice_schedule", pass_context=True)
def invoice_schedule_tick(context: job_context.JobContext, timestamp: int) -> int:
    """Run what became due; how many zone-months were worked."""
    engine = context.additional_context["engine"]
    return len(tick(engine, context.additional_context["settings"], datetime.now(UTC)))


@tasks.periodic(cron=get_settings().rollup_schedule_cron)
@tasks.task(name="rollups", queueing_lock="rollup_schedule", pass_context=True)
def rollup_schedule_tick(context: job_context.JobContext, timestamp: int) -> int:
    """Store the closed days' usage rollups; how many customers were stored."""
    engine, settings = context.additional_context["engine"], context.additional_context["settings"]
    return store_rollups(engine, datetime.now(UTC), UsageSettings.of(settings))
