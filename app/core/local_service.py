"""Running `gpumeter serve` locally, as the demo, tests and benchmarks do: a free port, and
waiting until the service answers ready."""

from __future__ import annotations

import socket
import subprocess
import time

import httpx


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something listens on ``host:port`` (as uvicorn would find it: SO_REUSEADDR,
    so a closed connection's TIME_WAIT does not count)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
        return False


class NotReady(RuntimeError):
    """The service exited, or did not answer ready in time."""


def wait_until_ready(
    base_url: str, process: subprocess.Popen[bytes] | None = None, timeout_s: float = 90
) -> None:
    """Poll ``GET /readyz`` until it answers 200 (database reachable and migrated).

    Raises NotReady as soon as ``process`` exits, or when ``timeout_s`` passes.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise NotReady(f"the service exited with code {process.returncode} before it was ready")
        try:
            if httpx.get(f"{base_url}/readyz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass  # not listening yet
        time.sleep(0.2)
    raise NotReady(f"{base_url} was not ready within {timeout_s:.0f} s")
