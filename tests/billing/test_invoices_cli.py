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
