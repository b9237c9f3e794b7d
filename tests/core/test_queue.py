"""The job queue: jobs deferred in the caller's transaction; `gpumeter worker` stops on SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from app.core.db import transaction
from app.core.queue import defer
from app.payments.jobs import QUEUEING_LOCK, sync_stripe
from tests.core.workers import FAST, live_workers, start_worker
from tests.harness import wait_for


def log_tail(tmp_path: Path) -> str:
    return "\n".join((tmp_path / "worker.log").read_text().splitlines()[-30:])


def jobs(db: Engine) -> list[tuple[str, str]]:
    with db.connect() as connection:
        rows = connection.execute(text("SELECT task_name, status FROM procrastinate_jobs"))
        return [(task, status) for task, status in rows]


def test_a_job_exists_only_if_its_transaction_commits(db: Engine) -> None:
    with pytest.raises(RuntimeError), transaction(db) as session:
        defer(session, sync_stripe)
        raise RuntimeError("the change fails")
    assert jobs(db) == []
    with transaction(db) as session:
        assert defer(session, sync_stripe) is not None
    assert jobs(db) == [("payments:sync_stripe", "todo")]


def test_a_waiting_job_with_the_same_queueing_lock_absorbs_the_next(db: Engine) -> None:
    with transaction(db) as session:
        first = defer(session, sync_stripe, queueing_lock=QUEUEING_LOCK)
        second = defer(session, sync_stripe, queueing_lock=QUEUEING_LOCK)
        session.execute(text("SELECT 1"))  # the transaction is still usable after the clash
    assert (first is not None, second) == (True, None)
    assert jobs(db) == [("payments:sync_stripe", "todo")]


@pytest.mark.e2e
def test_worker_stops_on_sigterm_within_its_shutdown_bound(
    db: Engine, database_url: str, tmp_path: Path
) -> None:
    worker = start_worker(database_url, tmp_path / "worker.log")
    try:
        wait_for(lambda: live_workers(db) == 1, "the worker to register", timeout_s=60)
        worker.send_signal(signal.SIGTERM)
        asked = time.monotonic()
        bound = float(FAST["GPUMETER_WORKER_SHUTDOWN_S"]) + 5  # + interpreter exit
        try:
            code = worker.wait(timeout=bound)
        except subprocess.TimeoutExpired:  # what it was still doing is in its log
            pytest.fail(f"still running {bound} s after SIGTERM:\n{log_tail(tmp_path)}")
        assert code == 0, log_tail(tmp_path)
        assert time.monotonic() - asked < bound
        assert live_workers(db) == 0  # it unregistered itself
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
