"""The API test harness: the console's calls as an admin, and bearer headers.

Its fixtures (``app``, ``client``, ``admin_key``, ``console``) live in ``tests/conftest.py``,
so every test package gets them without importing them."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from fastapi.testclient import TestClient

from app.core.processes import wait_until

if TYPE_CHECKING:
    from app.demo.slurm_cluster import LocalSlurm


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


class Console:
    """The console's calls, as an admin, with assertions on the status of each."""

    def __init__(self, client: TestClient, key: str) -> None:
        self.client = client
        self.headers = bearer(key)

    def post(self, path: str, body: dict[str, Any], status: int = 201) -> dict[str, Any]:
        response = self.client.post(path, json=body, headers=self.headers)
        assert response.status_code == status, response.text
        return response.json()

    def customer(self, name: str = "Acme AI", **fields: Any) -> dict[str, Any]:
        return self.post("/v1/customers", {"name": name, **fields})

    def plan(self, name: str = "on-demand", price: str = "2.49", **fields: Any) -> dict[str, Any]:
        prices = [
            {"gpu_model": "H100", "price_per_hour": price, "effective_from": "2026-01-01T00:00:00Z"}
        ]
        return self.post("/v1/plans", {"name": name, "prices": prices, **fields})

    def node(self, hostname: str = "node-1") -> dict[str, Any]:
        return self.post("/v1/nodes", {"hostname": hostname, "datacenter": "fra1"})

    def gpu(self, node_id: str, uuid: str, pool: str = "rentable") -> dict[str, Any]:
        return self.post(
            "/v1/gpus", {"uuid": uuid, "node_id": node_id, "model": "H100", "pool": pool}
        )

    @staticmethod
    def rental_body(customer_id: str, plan_id: str, **fields: Any) -> dict[str, Any]:
        """One H100 from 2026-11-01, unless ``fields`` say otherwise."""
        return {
            "customer_id": customer_id,
            "plan_id": plan_id,
            "gpu_model": "H100",
            "gpu_count": 1,
            "start_at": "2026-11-01T00:00:00Z",
            **fields,
        }

    def rental(self, customer_id: str, plan_id: str, **fields: Any) -> dict[str, Any]:
        return self.post("/v1/rentals", self.rental_body(customer_id, plan_id, **fields))

    def assign(
        self, rental_id: str, gpu_uuid: str, start: str, status: int = 201, **fields: Any
    ) -> dict[str, Any]:
        body = {"gpu_uuid": gpu_uuid, "start_at": start, **fields}
        return self.post(f"/v1/rentals/{rental_id}/assignments", body, status)


def wait_for(condition: Callable[[], object], what: str, timeout_s: float = 30) -> None:
    """Fail unless ``condition`` turns truthy within ``timeout_s``, saying ``what`` did not
    happen. Tests wait on conditions, never on fixed sleeps."""
    if not wait_until(lambda: bool(condition()), timeout_s, poll_s=0.05):
        raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


@dataclass(frozen=True)
class Ran:
    """A `gpumeter` command's exit status and what it printed."""

    code: int | str | None
    out: str
    err: str

    def rows(self) -> list[list[str]]:
        """A table's rows below its header, cells split where two or more spaces part them."""
        return [re.split(r"\s{2,}", line.strip()) for line in self.out.splitlines()[1:]]


def require_slurm(*, accounting: bool = False) -> None:
    """Skip a Slurm test where Slurm is not installed; in CI, which installs it, fail."""
    from app.demo.slurm_cluster import installed

    if installed(accounting=accounting):
        return
    packages = "slurm-wlm" + (" slurmdbd mariadb-server" if accounting else "")
    if os.environ.get("CI") == "true":
        pytest.fail(f"Slurm is not installed; .ci/run installs {packages}")
    pytest.skip(f"Slurm is not installed: apt-get install {packages} (CI installs it)")


@contextmanager
def running_slurm(tmp_path: Path, *args: Any, **kwargs: Any) -> Iterator[LocalSlurm]:
    """A throwaway cluster (``LocalSlurm(tmp_path / "slurm", *args, **kwargs)``), started, and
    stopped by its daemons' PIDs however the test ends."""
    from app.demo.slurm_cluster import LocalSlurm

    require_slurm(accounting=bool(kwargs.get("accounts")))
    directory = tmp_path / "slurm"
    directory.mkdir()
    cluster = LocalSlurm(directory, *args, **kwargs)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()
