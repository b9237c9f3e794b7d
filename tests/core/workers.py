"""Real `gpumeter worker` processes for the queue's end-to-end tests."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import Engine, text

from app.core.processes import stop_child

GPUMETER = Path(sys.executable).parent / "gpumeter"
# Short heartbeats, so a killed worker is found dead (and its jobs re-run) within seconds.
FAST = {
    "GPUMETER_WORKER_HEARTBEAT_S": "0.5",
    "GPUMETER_WORKER_STALLED_S": "2",
    "GPUMETER_WORKER_POLL_S": "0.5",
    "GPUMETER_WORKER_SHUTDOWN_S": "3",
}


def start_worker(
    database_url: str, log: Path, settings: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUMETER_")}
    env |= {"GPUMETER_DATABASE_URL": database_url, **FAST, **(settings or {})}
    # The service's key: the worker decrypts the webhook secrets the service stored.
    env["GPUMETER_SECRET_KEY"] = os.environ["GPUMETER_SECRET_KEY"]
    with log.open("ab") as out:
        return subprocess.Popen([str(GPUMETER), "worker"], env=env, stdout=out, stderr=out)


def live_workers(db: Engine) -> int:
    with db.connect() as connection:
        return connection.scalar(text("SELECT count(*) FROM procrastinate_workers")) or 0


@contextmanager
def workers(
    database_url: str, log_dir: Path, *, count: int = 1, settings: dict[str, str] | None = None
) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``count`` workers, stopped by SIGTERM (or killed, if they ignore it) at the end."""
    started = [
        start_worker(database_url, log_dir / f"worker-{n}.log", settings) for n in range(count)
    ]
    try:
        yield started
    finally:
        for n, process in enumerate(started):
            stop_child(process, f"worker-{n}", timeout_s=15)
