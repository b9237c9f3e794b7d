"""An operator's calls to the console API over HTTP, for the processes that drive the service
from outside as a provider would (the demo, the Slurm adapter): an admin key, bounded
timeouts, and any unexpected status raised with the service's own message."""

from __future__ import annotations

from typing import Any

import httpx


class ApiError(RuntimeError):
    pass


class Api:
    """An admin's calls; a status of 400 or more raises ``ApiError`` with the service's message."""

    def __init__(self, base_url: str, key: str, timeout_s: float = 60) -> None:
        self.client = httpx.Client(
            base_url=base_url, headers={"Authorization": f"Bearer {key}"}, timeout=timeout_s
        )

    def call(self, method: str, path: str, body: dict[str, Any] | None = None, **params: Any):
        response = self.client.request(method, path, json=body, params=params or None)
        if response.status_code >= 400:
            raise ApiError(f"{method} {path}: {response.status_code} {response.text[:500]}")
        return response.json()

    def post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        return self.call("POST", path, body)

    def get(self, path: str, **params: Any) -> Any:
        return self.call("GET", path, **params)

    def close(self) -> None:
        self.client.close()
