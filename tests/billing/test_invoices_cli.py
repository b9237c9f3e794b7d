"""`gpumeter invoices run` as an operator runs it: a real process on the test database."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from sqlalchemy import Engine

from tests.billing.world import october_with_failure
from tests.harness import Console

GPUMETER = Path(sys.executable).parent / "gpumeter"


def _run(database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GPUMETER_DATABASE_URL": database_url}
    command = [str(GPUMETER), "invoices", "run", *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)


def test_invoices_run_drafts_then_finalizes_idempotently(
    console: Console, db: Engine, database_url: str
) -> None:
    october_with_failure(console, db)
    for _ in range(2):
        drafted = _run(database_url, "--period", "2026-10")
        assert drafted.returncode == 0, drafted.stderr
        assert "1 customers: 1 drafted, 0 finalized" in drafted.stdout
        assert "[####" in drafted.stderr and "1/1 customers" in drafted.stderr
    finalized = _run(database_url, "--period", "2026-10", "--finalize")
    assert "1 finalized" in finalized.stdout, finalized.stderr
    again = _run(database_url, "--period", "2026-10", "--finalize")
    assert "0 finalized, 1 unchanged" in again.stdout
    listed = console.client.get("/v1/invoices", headers=console.headers).json()["items"]
    assert [(i["number"], i["total"]) for i in listed] == [("GM-2026-000001", "2202.20")]


def test_invoices_run_refuses_bad_periods(console: Console, database_url: str) -> None:
    console.customer()
    for period, message in (("2026-13", "YYYY-MM"), ("2099-01", "has not started")):
        result = _run(database_url, "--period", period)
        assert result.returncode == 2 and message in result.stderr, result.stderr


def test_invoices_run_as_of_a_past_time(console: Console, db: Engine, database_url: str) -> None:
    """A backfill finalized as of 2 Nov 06:00: generated, finalized and due (30 days) then."""
    october_with_failure(console, db)
    no_zone = _run(database_url, "--period", "2026-10", "--as-of", "2026-11-02T06:00:00")
    assert no_zone.returncode == 2 and "give the zone too" in no_zone.stderr
    done = _run(database_url, "--period", "2026-10", "--finalize", "--as-of", "2026-11-02T06:00Z")
    assert done.returncode == 0 and "1 finalized" in done.stdout, done.stderr
    [invoice] = console.client.get("/v1/invoices", headers=console.headers).json()["items"]
    assert (invoice["generated_at"], invoice["finalized_at"], invoice["due_at"]) == (
        "2026-11-02T06:00:00Z",
        "2026-11-02T06:00:00Z",
        "2026-12-02T06:00:00Z",
    )
