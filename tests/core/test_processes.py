"""Stopping what we started: bounded, by PID, and the embedded Postgres without a stale lock."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.core import embedded_pg
from app.core.processes import is_running, stop_child, wait_until

pytestmark = pytest.mark.e2e

IGNORES_SIGTERM = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)


def test_a_child_that_ignores_sigterm_is_killed_after_the_timeout() -> None:
    # The with block closes the child's stdout pipe (else a ResourceWarning at a later GC).
    with subprocess.Popen(
        [sys.executable, "-c", IGNORES_SIGTERM], stdout=subprocess.PIPE, text=True
    ) as child:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        started = time.monotonic()
        assert stop_child(child, "stubborn", timeout_s=0.5) == -signal.SIGKILL
        assert time.monotonic() - started < 5
        assert not is_running(child.pid)


def test_a_child_that_stops_on_sigterm_reports_its_exit_code() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    assert stop_child(child, "sleeper") == -signal.SIGTERM
    assert not is_running(child.pid)


def test_wait_until_gives_up_at_the_deadline() -> None:
    started = time.monotonic()
    assert not wait_until(lambda: False, timeout_s=0.3, poll_s=0.05)
    assert 0.3 <= time.monotonic() - started < 2
    assert wait_until(lambda: True, timeout_s=0)


def test_a_postgres_that_does_not_stop_in_time_is_reported_and_leaves_no_pid_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A frozen postmaster (SIGSTOP) answers neither a fast nor an immediate shutdown."""
    monkeypatch.setattr(embedded_pg, "IMMEDIATE_TIMEOUT_S", 1.0)
    pid_file = tmp_path / "pgdata" / "postmaster.pid"
    with (
        pytest.raises(embedded_pg.PostgresDidNotStop, match="did not stop within 1 s"),
        embedded_pg.embedded_postgres(tmp_path, stop_timeout_s=1.0),
    ):
        pid = int(pid_file.read_text().split()[0])
        os.kill(pid, signal.SIGSTOP)
    assert not is_running(pid)
    assert not pid_file.exists()


def test_the_embedded_postgres_stops_cleanly_and_removes_its_pid_file(tmp_path: Path) -> None:
    pid_file = tmp_path / "pgdata" / "postmaster.pid"
    with embedded_pg.embedded_postgres(tmp_path):
        pid = int(pid_file.read_text().split()[0])
        assert is_running(pid)
    assert not is_running(pid)
    assert not pid_file.exists()
