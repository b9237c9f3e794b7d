"""`gpumeter demo`'s command line, before anything starts."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from app.demo.run import DemoOptions, run_demo


def test_a_port_in_use_is_refused_before_anything_starts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    opened: list[Path] = []

    @contextmanager
    def open_database(directory: Path) -> Iterator[str]:  # never reached
        opened.append(directory)
        yield "postgresql://unused"

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        options = DemoOptions(data_dir=None, duration=0, port=port)
        assert run_demo(options, open_database) == 2
    assert opened == []
    err = capsys.readouterr().err
    assert f"port {port} is already in use" in err and "--port" in err
