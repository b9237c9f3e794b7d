"""Child processes the demo starts, each stopped by its own PID, newest first.

Children run in their own session, so a Ctrl-C in the terminal reaches only the demo, which
then stops them in order (agents flush to the service before the service stops). Their PIDs
are kept in ``state.json`` for anyone checking that nothing is left behind.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from app.core.processes import stop_child

log = logging.getLogger(__name__)


@dataclass
class Child:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path


class Processes:
    def __init__(self, directory: Path, *, stream_logs: bool = False) -> None:
        self.directory = directory
        self.stream_logs = stream_logs  # children log to the terminal instead of their files
        self.children: list[Child] = []
        self.extra_pids: dict[str, int] = {}  # started by others for us (the embedded Postgres)

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> Child:
        log_path = self.directory / f"{name}.log"
        with log_path.open("wb") as out:
            process = subprocess.Popen(
                argv,
                env=env,
                stdout=None if self.stream_logs else out,
                stderr=None if self.stream_logs else subprocess.STDOUT,
                start_new_session=True,
            )
        child = Child(name, process, log_path)
        self.children.append(child)
        log.info("process started", extra={"child": name, "pid": process.pid})
        self.save()
        return child

    def stop(self, child: Child) -> None:
        stop_child(child.process, child.name)

    def stop_all(self) -> None:
        for child in reversed(self.children):
            self.stop(child)

    def pids(self) -> dict[str, int]:
        return {**self.extra_pids, **{c.name: c.process.pid for c in self.children}}

    def save(self) -> None:
        path = self.directory / "state.json"
        path.write_text(json.dumps({"demo_pid": os.getpid(), "pids": self.pids()}, indent=2))
