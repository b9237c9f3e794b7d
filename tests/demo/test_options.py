"""`gpumeter demo`'s command line, before anything starts."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from app.demo.processes import Processes
from app.demo.run import DEMO_SELLER, Demo, DemoOptions, run_demo
from app.simulate.progress import Progress


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


def test_the_demo_seller_has_an_address_and_a_tax_id_unless_the_environment_names_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The demo's invoice is a complete legal document: its seller has a postal address and
    a tax id (the GPUMETER_SELLER_* settings); a seller set in the environment wins."""
    options = DemoOptions(data_dir=None, duration=0, port=0)
    for name in DEMO_SELLER:
        monkeypatch.delenv(name, raising=False)
    demo = Demo("postgresql://unused", tmp_path, Processes(tmp_path), Progress(), options)
    address = demo.env["GPUMETER_SELLER_ADDRESS"].splitlines()
    assert address == ["Hauptstr. 1", "10115 Berlin", "Germany"]
    assert demo.env["GPUMETER_SELLER_TAX_ID"] and demo.env["GPUMETER_SELLER_NAME"]
    monkeypatch.setenv("GPUMETER_SELLER_NAME", "Real Cloud Ltd")
    demo = Demo("postgresql://unused", tmp_path, Processes(tmp_path), Progress(), options)
    assert demo.env["GPUMETER_SELLER_NAME"] == "Real Cloud Ltd"
