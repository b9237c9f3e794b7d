"""docker-compose.yml cannot run here (no Docker engine), so check it against the CLI: every
``gpumeter`` / ``gpumeter-agent`` command parses with the real parsers, and every GPUMETER_*
variable is a setting."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.cli import build_parser
from app.settings import Settings
from metering_agent.cli import build_parser as agent_parser

ROOT = Path(__file__).resolve().parents[2]
PARSERS = {"gpumeter": build_parser, "gpumeter-agent": agent_parser}


def compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def commands() -> list[tuple[str, list[str]]]:
    out = []
    for name, service in compose()["services"].items():
        for key in ("entrypoint", "command"):
            argv = service.get(key)
            if argv is not None:
                out.append((f"{name}.{key}", argv if isinstance(argv, list) else argv.split()))
    return out


def environment() -> dict[str, str]:
    env: dict[str, str] = {}
    for service in compose()["services"].values():
        env.update(service.get("environment") or {})
    return env


def parse(argv: list[str]) -> argparse.Namespace:
    parser = PARSERS[argv[0]]()
    try:
        return parser.parse_args(argv[1:])
    except SystemExit as exit_:  # argparse's way of saying "unknown command or flag"
        raise AssertionError(f"{argv} does not parse") from exit_


def test_the_service_agent_and_registration_use_our_commands() -> None:
    programs = {where: argv[0] for where, argv in commands()}
    assert programs["service.command"] == "gpumeter"
    assert programs["agent.command"] == "gpumeter-agent"
    assert programs["agent-token.command"] == "gpumeter"


@pytest.mark.parametrize(
    ("where", "argv"), [c for c in commands() if c[1][0] in PARSERS], ids=lambda v: str(v)[:40]
)
def test_every_command_and_flag_exists(where: str, argv: list[str]) -> None:
    args = parse(argv)
    assert callable(getattr(args, "handler", None)) or argv[0] == "gpumeter-agent", where


def test_the_service_migrates_on_start_and_listens_on_all_interfaces() -> None:
    argv = compose()["services"]["service"]["command"]
    args = parse(argv)
    assert args.command == "serve" and args.host == "0.0.0.0"  # serve runs the migrations


def test_the_agent_reads_the_token_the_registration_writes() -> None:
    services = compose()["services"]
    written = parse(services["agent-token"]["command"]).token_file
    agent = parse(services["agent"]["command"])
    assert agent.token_file == written
    assert agent.server == "http://service:8000"


def test_every_gpumeter_variable_is_a_setting() -> None:
    fields = {f"GPUMETER_{name.upper()}" for name in Settings.model_fields}
    used = {key for key in environment() if key.startswith("GPUMETER_")}
    assert used, "compose sets no GPUMETER_ variables"
    assert used <= fields, f"not settings: {sorted(used - fields)}"


def test_the_dockerfile_default_command_is_serve() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert 'CMD ["gpumeter", "serve", "--host", "0.0.0.0", "--port", "8000"]' in dockerfile
    assert parse(["gpumeter", "serve", "--host", "0.0.0.0", "--port", "8000"]).command == "serve"
