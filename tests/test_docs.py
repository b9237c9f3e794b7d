"""The docs name every setting, command, option and route, and the README keeps the two commands.

The reference pages are docs/configuration.md (generated from ``app.settings.Settings``: it
must equal what ``tools.configuration_doc`` renders), docs/operations.md (the ``gpumeter``
commands), docs/agent.md (``gpumeter-agent``), docs/slurm.md (``gpumeter-slurm``) and
docs/api.md (every route of the application). No database is needed.
"""

from __future__ import annotations

import argparse
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path

import fastapi.routing
import pytest
from sqlalchemy import create_engine

import app.cli
import app.slurm.cli
import metering_agent.cli
from app.main import create_app
from app.settings import Settings
from tools import configuration_doc

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
HTTP_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
# A route as the docs write it: `GET /v1/x`, or several methods at once, `POST/GET /v1/x`.
DOCUMENTED_ROUTE = re.compile(
    rf"\b((?:{'|'.join(HTTP_METHODS)})(?:/(?:{'|'.join(HTTP_METHODS)}))*) (/[\w\-./{{}}]*)"
)
# Each program's reference page; pyproject's [project.scripts] must list exactly these.
CLI_PAGES = {
    "gpumeter": (app.cli.build_parser, "operations.md"),
    "gpumeter-agent": (metering_agent.cli.build_parser, "agent.md"),
    "gpumeter-slurm": (app.slurm.cli.build_parser, "slurm.md"),
}


def page(name: str) -> str:
    return (DOCS / name).read_text()


def test_the_configuration_page_is_what_the_settings_generate() -> None:
    assert page("configuration.md") == configuration_doc.render(), (
        "docs/configuration.md differs from app/settings.py: run "
        "`.venv/bin/python -m tools.configuration_doc` and commit the page"
    )


def test_every_setting_is_on_the_configuration_page_with_a_description() -> None:
    text = page("configuration.md")
    for name, field in Settings.model_fields.items():
        assert field.description, f"Settings.{name} has no description"
        assert f"| `{configuration_doc.env_name(name)}` |" in text, name
    assert "| `GPUMETER_TELEMETRY_RETENTION_DAYS` | 400 |" in text


def test_the_settings_file_carries_no_issue_markers() -> None:
    source = (REPO / "app" / "settings.py").read_text()
    assert not re.search(r"\bissues? \d+", source, re.IGNORECASE)


def commands(parser: argparse.ArgumentParser, path: str) -> Iterator[tuple[str, list[str]]]:
    """Every command under ``parser`` as its full invocation and its long options."""
    options = [o for a in parser._actions for o in a.option_strings if o.startswith("--")]
    yield path, [o for o in options if o != "--help"]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from commands(sub, f"{path} {name}")


def test_the_programs_documented_are_the_installed_scripts() -> None:
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert set(scripts) == set(CLI_PAGES)


@pytest.mark.parametrize("program", sorted(CLI_PAGES))
def test_every_command_and_option_is_on_its_programs_page(program: str) -> None:
    build_parser, name = CLI_PAGES[program]
    text = page(name)
    missing = [
        f"{path} {option}" if option else path
        for path, options in commands(build_parser(), program)
        for option in [None, *options]
        if (option or f"`{path}") not in text
    ]
    assert not missing, f"docs/{name} does not name: {missing}"


def app_routes() -> set[tuple[str | None, str]]:
    """Every route of the service as (method, path), a mount as (None, path): its routes and
    the OpenAPI document's operations (ingest is served ahead of the routes, and documented)."""
    # The app only: its engine never connects.
    service = create_app(create_engine("postgresql+psycopg://docs@127.0.0.1:9/none"), worker=False)
    service.state.ingest_writers.close(5.0)
    # FastAPI 0.165 keeps included routers as routes of their own; older ones flatten them.
    contexts = getattr(fastapi.routing, "iter_route_contexts", lambda routes: routes)
    routes: set[tuple[str | None, str]] = set()
    for route in contexts(service.routes):
        methods = getattr(route, "methods", None) or {None}
        routes |= {(m, route.path) for m in methods if m != "HEAD"}
    for path, operations in service.openapi()["paths"].items():
        routes |= {(m.upper(), path) for m in operations if m.upper() in HTTP_METHODS}
    return routes


def normalized(path: str) -> str:
    """A path with its parameters unnamed: the docs write `{id}` where the code has
    `{customer_id}`."""
    path = re.sub(r"\{[^}]*\}", "{}", path.rstrip("."))
    return path if path == "/" else path.rstrip("/")


def documented_routes(text: str) -> set[tuple[str, str]]:
    return {
        (method, normalized(path))
        for methods, path in DOCUMENTED_ROUTE.findall(text)
        for method in methods.split("/")
    }


def test_every_route_is_on_the_api_page() -> None:
    text = page("api.md")
    documented = documented_routes(text)
    routes = app_routes()
    assert ("POST", "/v1/ingest") in routes and ("GET", "/dashboard") in routes
    missing = sorted(
        f"{method or 'mount'} {path}"
        for method, path in routes
        if (method, normalized(path)) not in documented
        and not (method is None and f"`{path}`" in text)
    )
    assert not missing, f"docs/api.md does not list: {missing}"
    stale = documented - {(m, normalized(p)) for m, p in routes}
    assert not stale, f"docs/api.md lists routes the application does not have: {sorted(stale)}"


def test_the_readme_keeps_the_two_commands_that_ci_runs() -> None:
    readme = (REPO / "README.md").read_text()
    two = readme.split("## The two commands")[1].split("```sh")[1].split("```")[0]
    runs = [line for line in two.splitlines() if line and not line.startswith("#")]
    assert runs == [
        "python3 -m venv .venv && .venv/bin/pip install . && .venv/bin/gpumeter demo",
        "bash .ci/run",
    ]
    assert (REPO / ".ci" / "run").is_file()  # what CI runs: the README's second command


def test_the_readme_links_every_docs_page() -> None:
    readme = (REPO / "README.md").read_text()
    unlinked = [p.name for p in sorted(DOCS.glob("*.md")) if f"(docs/{p.name})" not in readme]
    assert not unlinked, f"README.md links no {unlinked}"


def test_bench_readme_says_how_to_run_every_bench() -> None:
    readme = (REPO / "bench" / "README.md").read_text()
    unnamed = [
        p.name for p in sorted((REPO / "bench").glob("*.py")) if f"bench/{p.name}" not in readme
    ]
    assert not unnamed, f"bench/README.md does not name {unnamed}"
