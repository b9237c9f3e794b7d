"""The job queue: procrastinate on the service's own Postgres (its schema: migration 0009).

All background work runs here: the Stripe mirror, webhook deliveries, the scheduled invoice
run and, later, failover timers. Domain packages declare their tasks on a procrastinate
``Blueprint``; the composition root (``app.wiring``) adds them to the one ``queue`` app of
the process. Jobs are deferred with ``defer`` in the caller's SQLAlchemy transaction, so a
job exists exactly when the change that asked for it commits (an outbox with a worker).

A worker that dies mid-job leaves it ``doing``; ``retry_stalled`` (periodic, here) puts the
jobs of workers whose heartbeat stopped back in the queue, so every job runs to its end at
least once. Tasks must therefore be idempotent (each one says how).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any

import procrastinate
from procrastinate import exceptions, job_context, manager, worker
from prometheus_client import Histogram
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from app.settings import Settings

log = logging.getLogger(__name__)

queue = procrastinate.App(connector=procrastinate.PsycopgConnector())
core_tasks = procrastinate.Blueprint()
# Deferring on a caller's connection goes through a sync connector, whatever the app has open.
_in_transaction = manager.JobManager(procrastinate.SyncPsycopgConnector())

JOB_SECONDS = Histogram(
    "gpumeter_job_duration_seconds", "How long jobs ran, by task and outcome.", ["task", "outcome"]
)
JOB_LATENESS = Histogram(
    "gpumeter_job_start_delay_seconds",
    "Seconds from a job's scheduled time (or deferral, if unscheduled) to its start.",
    ["task"],
)


def defer(
    session: Session,
    task: procrastinate.tasks.Task[Any, Any, Any],
    *,
    lock: str | None = None,
    queueing_lock: str | None = None,
    schedule_at: datetime | None = None,
    **task_kwargs: Any,
) -> int | None:
    """Queue ``task(**task_kwargs)`` in the session's transaction; its job id, or None when a
    job with the same ``queueing_lock`` is already waiting (that one will do the work)."""
    job = task.configure(
        lock=lock, queueing_lock=queueing_lock, schedule_at=schedule_at, task_kwargs=task_kwargs
    ).job
    try:
        with session.begin_nested():  # a queueing-lock clash undoes only this insert
            # Asked for inside the block, so SQLAlchemy has emitted the SAVEPOINT on it.
            connection = session.connection().connection.driver_connection
            [deferred] = _in_transaction.batch_defer_jobs([job], connection=connection)
    except exceptions.AlreadyEnqueued:
        return None
    return deferred.id


@core_tasks.periodic(cron="* * * * * */5")
@core_tasks.task(queueing_lock="retry_stalled", pass_context=True)
async def retry_stalled(context: job_context.JobContext, timestamp: int) -> None:
    """Re-queue the jobs of workers whose heartbeat stopped (killed, frozen, lost)."""
    stalled_after = context.additional_context["settings"].worker_stalled_s
    job_manager = context.app.job_manager
    for job in await job_manager.get_stalled_jobs(seconds_since_heartbeat=stalled_after):
        log.warning("re-queueing a stalled job", extra={"job": job.call_string})
        await job_manager.retry_job(job)


async def _measure(
    call_next: Callable[[], Awaitable[Any]],
    context: job_context.JobContext,
    _: worker.Worker,
) -> Any:
    job = context.job
    if job.scheduled_at is not None:
        lateness = max(0.0, context.start_timestamp - job.scheduled_at.timestamp())
        JOB_LATENESS.labels(job.task_name).observe(lateness)
    started, outcome = time.perf_counter(), "failed"
    try:
        result = await call_next()
        outcome = "succeeded"
        return result
    finally:
        JOB_SECONDS.labels(job.task_name, outcome).observe(time.perf_counter() - started)


def conninfo(engine: Engine) -> str:
    """The libpq URL of a SQLAlchemy engine (``postgresql+psycopg://`` -> ``postgresql://``)."""
    return engine.url.set(drivername="postgresql").render_as_string(hide_password=False)


@asynccontextmanager
async def opened(engine: Engine, settings: Settings) -> AsyncIterator[procrastinate.App]:
    """The queue app, for this block, on its own connection pool to ``engine``'s database."""
    size = settings.worker_concurrency + 2  # jobs, plus LISTEN and heartbeats
    connector = procrastinate.PsycopgConnector(
        conninfo=conninfo(engine), min_size=1, max_size=size, timeout=30
    )
    with queue.replace_connector(connector) as app:
        async with app.open_async():
            yield app


async def run_worker(
    engine: Engine, settings: Settings, *, name: str, stop_on_signals: bool
) -> None:
    """Work jobs until stopped: by SIGTERM/SIGINT (with ``stop_on_signals``) or by cancellation.
    Stopping waits ``worker_shutdown_s`` for running jobs, then aborts them."""
    signalled = _cancel_on_signals() if stop_on_signals else None
    try:
        async with opened(engine, settings) as app:
            await app.run_worker_async(
                name=name,
                concurrency=settings.worker_concurrency,
                install_signal_handlers=False,  # ours, from before the worker registers
                shutdown_graceful_timeout=settings.worker_shutdown_s,
                update_heartbeat_interval=settings.worker_heartbeat_s,
                stalled_worker_timeout=settings.worker_stalled_s,
                fetch_job_polling_interval=settings.worker_poll_s,
                delete_jobs="successful",
                additional_context={"engine": engine, "settings": settings},
                worker_middleware=[_measure],
            )
    except asyncio.CancelledError:
        if signalled is None or not signalled.is_set():
            raise  # cancelled by its caller, not stopped by a signal


def _cancel_on_signals() -> asyncio.Event:
    """SIGTERM/SIGINT cancel the running task, which procrastinate turns into a graceful stop.
    Its own handlers come only after it registers the worker, so a signal in between killed the
    process outright; these are in place from the start. The event says a signal did it."""
    loop, task, signalled = asyncio.get_running_loop(), asyncio.current_task(), asyncio.Event()
    assert task is not None

    def stop() -> None:
        signalled.set()
        task.cancel()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)
    return signalled


async def _keep_working(engine: Engine, settings: Settings) -> None:
    """Run the worker; when it fails (database down, not yet migrated), log it and start it
    again after a growing, bounded delay, so the service keeps serving meanwhile."""
    delay = 1.0
    while True:
        try:
            await run_worker(engine, settings, name="in-process", stop_on_signals=False)
            return
        except Exception:
            log.exception("the in-process worker failed; restarting it", extra={"in_s": delay})
        await asyncio.sleep(delay)
        delay = min(delay * 2, 60.0)


@asynccontextmanager
async def worker_in_background(engine: Engine, settings: Settings) -> AsyncIterator[None]:
    """A worker on this event loop while the block runs (the service's in-process worker)."""
    task = asyncio.create_task(_keep_working(engine, settings))
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
