"""Real processes: the service (`gpumeter serve`) and node agents (`gpumeter-agent`).

Every process started here is stopped by its PID in the fixture's teardown.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine

from app.auth.models import KeyKind
from app.auth.service import issue_key
from app.core.db import transaction
from app.core.local_service import NotReady, free_port, wait_until_ready
from app.core.processes import stop_child

BIN = Path(sys.executable).parent


@dataclass
class Service:
    database_url: str
    logs: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        env = {**os.environ, "GPUMETER_DATABASE_URL": self.database_url}
        # The child keeps its own descriptor of the log; ours is closed at once.
        with open(self.logs / f"service-{time.time():.0f}.log", "wb") as log:
            self.process = subprocess.Popen(
                [str(BIN / "gpumeter"), "serve", "--port", str(self.port)],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:
            wait_until_ready(self.url, self.process, timeout_s=120)
        except NotReady:
            self.stop()  # a service that never got ready is stopped too, not left behind
            raise

    def stop(self) -> None:
        if self.process is not None:
            stop_child(self.process, "service")
            self.process = None


@dataclass
class Fleet:
    """The running service plus an admin's view of it."""

    service: Service
    admin: str
    tmp: Path
    agents: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def get(self, path: str) -> Any:
        response = httpx.get(self.service.url + path, headers=self._auth, timeout=10)
        assert response.status_code == 200, response.text
        return response.json()

    @property
    def _auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.admin}"}

    def node(self, hostname: str) -> str:
        response = httpx.post(
            self.service.url + "/v1/nodes",
            headers=self._auth,
            timeout=10,
            json={"hostname": hostname, "datacenter": "e2e"},
        )
        assert response.status_code == 201, response.text
        return response.json()["token"]["key"]

    def agent(
        self, name: str, token: str, *options: str, faults: list[dict] | None = None
    ) -> subprocess.Popen[bytes]:
        args = [
            str(BIN / "gpumeter-agent"),
            "--server",
            self.service.url,
            "--token",
            token,
            "--spool-dir",
            str(self.tmp / f"spool-{name}"),
            "--node-name",
            name,
            "--uuid-prefix",
            name,
            "--upload-interval",
            "1",
            "--backoff-max",
            "2",
            "--seed",
            "7",
            *options,
        ]
        if faults is not None:
            script = self.tmp / f"faults-{name}.json"
            script.write_text(json.dumps(faults))
            args += ["--faults", str(script)]
        with open(self.tmp / f"agent-{name}-{time.time():.0f}.log", "wb") as log:
            process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        self.agents.append(process)
        return process

    def agent_metric(self, port: int, name: str) -> float:
        """An unlabelled sample from an agent's /metrics (0 while it does not answer)."""
        try:
            text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        except httpx.TransportError:
            return 0.0
        samples = (line.split() for line in text.splitlines() if line.startswith(name + " "))
        return next((float(sample[1]) for sample in samples), 0.0)

    def gpus(self) -> list[dict[str, Any]]:
        return self.get("/v1/gpus?limit=1000")["items"]

    def timeline(self, gpu: str, start: int, end: int) -> dict[str, Any]:
        return self.get(f"/v1/gpus/{gpu}/timeline?start={start}&end={end}")


@pytest.fixture
def fleet(db: Engine, database_url: str, tmp_path: Path) -> Iterator[Fleet]:
    with transaction(db) as session:
        admin = issue_key(session, KeyKind.ADMIN, "e2e").secret
    service = Service(database_url, tmp_path)
    service.start()
    fleet = Fleet(service, admin, tmp_path)
    try:
        yield fleet
    finally:
        for process in fleet.agents:
            stop_child(process, "agent", sig=signal.SIGKILL)
        service.stop()


def seconds(items: list[dict[str, Any]]) -> int:
    return sum(i["end_s"] - i["start_s"] for i in items)


def assert_exact_cover(timeline: dict[str, Any], start: int, end: int) -> None:
    """Segments and unmetered gaps tile [start, end): in order, no overlap, no hole."""
    pieces = sorted(
        [(s["start_s"], s["end_s"]) for s in timeline["segments"]]
        + [(g["start_s"], g["end_s"]) for g in timeline["unmetered"]]
    )
    cursor = start
    for a, b in pieces:
        assert a == cursor, (a, cursor, pieces)
        cursor = b
    assert cursor == end
    assert seconds(timeline["segments"]) + seconds(timeline["unmetered"]) == end - start
