"""The scheduled monthly invoice run: once a zone's month and its grace time are over, draft
(and, per ``invoice_schedule_finalize``, finalize) every invoice of that zone's customers.
And the hourly store of the closed days' and hours' usage rollups (``store_rollups``).

Each tick notes every (month, billing time zone) that became due, then works the due ones one
at a time, each in one transaction with its row locked: a zone's month runs once, however many
workers tick, and a failed try rolls back whole and is tried again at the next tick. The run
itself is billing's (``app.billing.run.run_invoices``), idempotent per customer.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from app.billing.loader import billing_period
from app.billing.run import run_invoices
from app.billing.service import BillingSettings
from app.billing.usage import UsageSettings, store_closed
from app.core.db import transaction
from app.customers import service as customers_service
from app.schedule import repository
from app.schedule.models import RunStatus, ScheduledRun
from app.settings import Settings

log = logging.getLogger(__name__)
MAX_ATTEMPTS = 5


def closed_period(timezone: str, now: datetime, grace_hours: int) -> str | None:
    """The zone's previous month, once its grace time has passed by ``now``."""
    first_of_month = now.astimezone(ZoneInfo(timezone)).replace(day=1)
    previous = (first_of_month - timedelta(days=1)).strftime("%Y-%m")
    ends = billing_period(previous, timezone).end
    return previous if now >= ends + timedelta(hours=grace_hours) else None


def tick(engine: Engine, settings: Settings, now: datetime) -> list[int]:
    """Note what became due, then work every due run once; the ids of the runs worked."""
    with transaction(engine) as session:
        for zone in customers_service.billing_zones(session):
            period = closed_period(zone, now, settings.invoice_grace_hours)
            if period is not None:
                repository.add_due(session, period, zone, settings.invoice_schedule_finalize)
    worked: list[int] = []
    config = BillingSettings.of(settings)
    while (run_id := _work_next(engine, now, config, exclude=worked)) is not None:
        worked.append(run_id)
    return worked


def _work_next(
    engine: Engine, now: datetime, config: BillingSettings, exclude: list[int]
) -> int | None:
    run_id = None
    try:
        with transaction(engine) as session:
            run = repository.claim_next(session, MAX_ATTEMPTS, exclude)
            if run is None:
                return None
            run_id = run.id
            _run(session, run, now, config)
    except Exception as error:
        if run_id is None:
            raise
        log.exception("scheduled invoice run failed", extra={"run_id": run_id})
        with transaction(engine) as session:
            failed = session.get_one(ScheduledRun, run_id, with_for_update=True)
            failed.status, failed.attempts = RunStatus.FAILED, failed.attempts + 1
            failed.error = f"{type(error).__name__}: {error}"[:2000]
    return run_id


def _run(session: Session, run: ScheduledRun, now: datetime, config: BillingSettings) -> None:
    """The zone's month on the invoice runs' own batched path (as the API and the CLI run it)."""
    summary = run_invoices(
        session, run.period, now, config=config, timezone=run.timezone, finalize=run.finalize
    )
    run.status, run.attempts, run.error = RunStatus.SUCCEEDED, run.attempts + 1, None
    run.customers = summary.customers
    run.counts = {outcome.value: n for outcome, n in summary.counts.items()}
    run.failures = {str(c): message for c, message in summary.failures.items()}
    run.finished_at = now
    log.info("scheduled invoice run", extra={"period": run.period, "timezone": run.timezone})


def store_rollups(engine: Engine, now: datetime, config: UsageSettings) -> int:
    """Store every customer's closed days' and the open day's closed hours' rollups where
    missing or stale (late telemetry), one transaction per customer: a read then rates at most
    the last hour or so live.
    A customer that fails is logged and left to its next read; how many were stored."""
    with transaction(engine) as session:
        customer_ids = customers_service.customer_ids(session)
    stored = 0
    for customer_id in customer_ids:
        try:
            with transaction(engine) as session:
                customer = customers_service.existing_customer(session, customer_id)
                store_closed(session, customer, now, config)
            stored += 1
        except Exception:
            log.exception("usage rollups not stored", extra={"customer_id": str(customer_id)})
    return stored
