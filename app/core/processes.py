"""Stopping processes we started: by PID, waited for, every wait bounded.

One helper for the demo, the embedded Postgres, the tests and the benchmarks, so "stopped"
means the same everywhere: the process is gone (or a zombie only its parent can reap), not
merely signalled.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 20.0  # a graceful stop: agents flush their spool, uvicorn drains requests
KILL_TIMEOUT_S = 5.0  # after SIGKILL only the kernel is left to wait for


class StillRunning(RuntimeError):
    """A process outlived its stop, SIGKILL included (stuck in the kernel)."""


def stop_child(
    process: subprocess.Popen[bytes] | subprocess.Popen[str],
    name: str,
    *,
    sig: int = signal.SIGTERM,
    timeout_s: float = STOP_TIMEOUT_S,
) -> int:
    """Send ``sig``, wait up to ``timeout_s``, then SIGKILL and wait; the exit code.

    Raises StillRunning when even SIGKILL did not end it within KILL_TIMEOUT_S.
    """
    if process.poll() is None:
        process.send_signal(sig)
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            log.warning(
                "process did not stop in time; killing it",
                extra={"child": name, "pid": process.pid, "timeout_s": timeout_s},
            )
            process.kill()
            try:
                process.wait(KILL_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                raise StillRunning(f"{name} (pid {process.pid}) survived SIGKILL") from None
    log.info(
        "process stopped",
        extra={"child": name, "pid": process.pid, "returncode": process.returncode},
    )
    return process.returncode


def is_running(pid: int) -> bool:
    """Whether ``pid`` runs; a zombie (exited, not yet reaped by its parent, which in a
    container without an init process may never happen) counts as stopped."""
    if not Path("/proc/self").exists():  # no procfs (macOS): ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True  # someone else's process
        return True
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


def wait_until(condition: Callable[[], bool], timeout_s: float, poll_s: float = 0.1) -> bool:
    """Poll ``condition`` until it holds (True) or ``timeout_s`` passes (False)."""
    deadline = time.monotonic() + timeout_s
    while True:
        if condition():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)


def wait_for_exit(pid: int, timeout_s: float) -> bool:
    """True once ``pid`` (not necessarily our child) has stopped, False after ``timeout_s``."""
    return wait_until(lambda: not is_running(pid), timeout_s)
