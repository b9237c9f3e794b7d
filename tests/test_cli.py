"""The `gpumeter` command as a user runs it: real processes, real Postgres."""

from __future__ import annotations

import argparse
import json
import os
import pty
import resource
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from importlib.metadata import version
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, create_engine

from app.auth.models import KeyKind
from app.auth.service import issue_key
from app.cli import build_parser, main
from app.core.db import transaction
from app.core.local_service import free_port, wait_until_ready
from app.core.processes import wait_for_exit
from app.core.scratch_db import scratch_database
from app.customers.models import Customer
from app.main import create_app
from app.settings import SECRET_KEY_FILE, embedded_secret_key, sqlalchemy_url
from tests.harness import Console, Ran, bearer

BIN = Path(sys.executable).parent


def env_without_database() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "GPUMETER_DATABASE_URL"}


def _commands(parser: argparse.ArgumentParser) -> Iterator[list[str]]:
    """Every command and subcommand of ``parser``, as the words that name it."""
    yield []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from ([name, *words] for words in _commands(sub))


def test_help_is_available_for_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    commands = list(_commands(build_parser()))
    assert ["invoices", "run"] in commands and ["admin", "create-key"] in commands
    for words in commands:
        with pytest.raises(SystemExit) as exited:
            main([*words, "--help"])
        assert exited.value.code == 0, words
        assert f"usage: gpumeter {' '.join(words)}".strip() in capsys.readouterr().out
    # The installed entry point answers too (once: each process costs a second of imports).
    result = subprocess.run([BIN / "gpumeter", "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and "usage: gpumeter" in result.stdout


def test_version_is_the_installed_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"gpumeter {version('gpumeter')}"


def test_db_upgrade_and_create_key_on_a_configured_database(database_url: str, db: object) -> None:
    env = {**os.environ, "GPUMETER_DATABASE_URL": database_url}
    upgraded = subprocess.run(
        [BIN / "gpumeter", "db", "upgrade"], env=env, capture_output=True, text=True
    )
    assert upgraded.returncode == 0, upgraded.stderr
    assert upgraded.stdout.strip() == "database migrated to head"
    created = subprocess.run(
        [BIN / "gpumeter", "admin", "create-key", "--kind", "admin", "--name", "ops"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    key = created.stdout.strip()
    assert key.startswith("gm_admin_")
    app = create_app(create_engine(sqlalchemy_url(database_url)))
    with TestClient(app) as client:
        response = client.get("/v1/keys", headers={"Authorization": f"Bearer {key}"})
    assert response.status_code == 200
    assert [k["name"] for k in response.json()["items"]] == ["ops"]


def test_create_key_for_a_customer_needs_the_customer(database_url: str, db: Engine) -> None:
    env = {**os.environ, "GPUMETER_DATABASE_URL": database_url}
    command = [str(BIN / "gpumeter"), "admin", "create-key", "--kind", "customer", "--name", "ci"]
    refused = subprocess.run(command, env=env, capture_output=True, text=True)
    assert refused.returncode == 2
    assert "--kind customer needs --customer ID" in refused.stderr
    with transaction(db) as session:
        customer = Customer(name="Acme", currency="USD")
        session.add(customer)
        session.flush()
        customer_id = str(customer.id)
    created = subprocess.run(
        [*command, "--customer", customer_id], env=env, capture_output=True, text=True
    )
    assert created.returncode == 0, created.stderr
    assert created.stdout.startswith("gm_customer_")


def test_an_unreachable_database_is_a_message_not_a_traceback() -> None:
    env = {
        **os.environ,
        "GPUMETER_DATABASE_URL": f"postgresql://postgres@127.0.0.1:{free_port()}/x",
    }
    result = subprocess.run(
        [BIN / "gpumeter", "customers", "list"], env=env, capture_output=True, text=True, timeout=60
    )
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr.startswith("gpumeter customers list: database error: connection ")
    assert "Traceback" not in result.stderr


def test_readyz_is_503_on_an_unmigrated_database(pg_server_url: str) -> None:
    with scratch_database(pg_server_url, "gpumeter_unmigrated", migrated=False) as url:
        engine = create_engine(sqlalchemy_url(url))
        try:
            with TestClient(create_app(engine)) as client:
                response = client.get("/readyz")
        finally:
            engine.dispose()
    assert response.status_code == 503
    assert "gpumeter db upgrade" in response.json()["reason"]


def test_readyz_is_503_when_the_database_is_unreachable() -> None:
    engine = create_engine(
        f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/x",
        connect_args={"connect_timeout": 2},
    )
    with TestClient(create_app(engine)) as client:
        response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["reason"].startswith("database unreachable")


@pytest.mark.e2e
@pytest.mark.parametrize("workers", [1, 2])
def test_serve_without_a_url_runs_on_embedded_postgres_and_stops_it(
    tmp_path: Path, workers: int
) -> None:
    port = free_port()
    data_dir = tmp_path / "data"
    env = env_without_database()
    serve = subprocess.Popen(
        [
            BIN / "gpumeter",
            "serve",
            "--port",
            str(port),
            "--workers",
            str(workers),
            "--data-dir",
            str(data_dir),
        ],
        env=env,
        stderr=subprocess.PIPE,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until_ready(url, serve, timeout_s=120)
        # A second command on the same data dir reuses the running server (the bootstrap path).
        key = subprocess.run(
            [
                BIN / "gpumeter",
                "admin",
                "create-key",
                "--name",
                "boot",
                "--data-dir",
                str(data_dir),
            ],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        response = httpx.get(f"{url}/v1/customers", headers={"Authorization": f"Bearer {key}"})
        assert response.status_code == 200
        pid_file = data_dir / "pgdata" / "postmaster.pid"
        postgres_pid = int(pid_file.read_text().splitlines()[0])
    finally:
        serve.send_signal(signal.SIGTERM)
        _, stderr = serve.communicate(timeout=60)
    assert serve.returncode == 0, stderr.decode()[-2000:]
    assert not pid_file.exists()
    assert wait_for_exit(postgres_pid, timeout_s=10), f"postgres {postgres_pid} still runs"


def test_serve_refuses_to_start_without_a_secret_on_a_configured_database(
    database_url: str,
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "GPUMETER_SECRET_KEY"}
    env["GPUMETER_DATABASE_URL"] = database_url
    refused = subprocess.run(
        [BIN / "gpumeter", "serve", "--port", str(free_port())],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2
    assert "GPUMETER_SECRET_KEY is not set" in refused.stderr


def test_the_embedded_default_generates_its_secret_once_readable_only_by_its_owner(
    tmp_path: Path,
) -> None:
    first = embedded_secret_key(tmp_path / "data")
    assert len(first) >= 32
    assert (tmp_path / "data" / SECRET_KEY_FILE).stat().st_mode & 0o777 == 0o600
    assert embedded_secret_key(tmp_path / "data") == first  # kept, not regenerated
    assert embedded_secret_key(tmp_path / "other") != first


def _parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _parsers(sub)


def test_every_command_and_option_has_help() -> None:
    missing = []
    for parser in _parsers(build_parser()):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                described = {choice.dest for choice in action._choices_actions if choice.help}
                missing += [f"{parser.prog} {n}" for n in action.choices if n not in described]
            elif not action.help or action.help == argparse.SUPPRESS:
                missing.append(f"{parser.prog} {'/'.join(action.option_strings) or action.dest}")
    assert missing == []


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["serve", "--port", "70000"], "argument --port: give 1 to 65535, not 70000"),
        (["serve", "--workers", "0"], "argument --workers: give 1 to 256, not 0"),
        (["worker", "--concurrency", "65"], "argument --concurrency: give 1 to 64, not 65"),
        (
            ["admin", "create-key", "--name", ""],
            "argument --name: String should have at least 1 character",
        ),
        (
            ["admin", "create-key", "--name", "ops", "--kind", "root"],
            "argument --kind: give one of admin, customer, node, scheduler, not 'root'",
        ),
        (
            ["admin", "register-node", "--hostname", "h" * 254],
            "argument --hostname: String should have at most 253 characters",
        ),
        (["simulate", "--days", "-1"], "argument --days: give a number above 0, not -1"),
        (
            ["simulate", "--failure-rate", "nan"],
            "argument --failure-rate: give a number 0 or more, not nan",
        ),
        (["demo", "--duration", "0"], "argument --duration: give a number above 0, not 0"),
        (["keys", "list", "--limit", "0"], "argument --limit: give 1 to 1000, not 0"),
        (["keys", "revoke", "k1"], "argument key_id: not an API key id (a UUID): 'k1'"),
        (
            ["invoices", "list", "--period", "2026-1"],
            "argument --period: give a billing month as YYYY-MM, 1970-01 to 2999-12, not '2026-1'",
        ),
    ],
    ids=lambda value: " ".join(value)[:40] if isinstance(value, list) else "",
)
def test_arguments_are_checked_while_parsing(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    named = {" ".join(words) for words in _commands(build_parser())}
    command = max(
        (" ".join(argv[:n]) for n in range(len(argv)) if " ".join(argv[:n]) in named), key=len
    )
    assert capsys.readouterr().err.splitlines()[-1] == f"gpumeter {command}: error: {message}"


def test_keys_list_show_and_revoke(
    db: Engine, admin_key: str, client: TestClient, gpumeter: Callable[..., Ran]
) -> None:
    with transaction(db) as session:
        customer = Customer(name="Acme", currency="USD")
        session.add(customer)
        session.flush()
        acme = issue_key(session, KeyKind.CUSTOMER, "acme ci", customer_id=customer.id)
    keys = client.get("/v1/keys", headers=bearer(admin_key)).json()
    admin, customer_key = keys["items"]

    listed = gpumeter("keys", "list")
    assert listed.code == 0, listed.err
    assert listed.out.split()[:7] == ["ID", "KIND", "NAME", "PREFIX", "OWNER", "CREATED", "REVOKED"]
    assert [row[:5] + row[6:] for row in listed.rows()] == [
        [admin["id"], "admin", "test admin", admin["prefix"], "-", "-"],
        [customer_key["id"], "customer", "acme ci", customer_key["prefix"], str(customer.id), "-"],
    ]
    assert json.loads(gpumeter("keys", "list", "--json").out) == keys
    only_customers = json.loads(gpumeter("keys", "list", "--kind", "customer", "--json").out)
    assert only_customers["items"] == [customer_key]
    paged = gpumeter("keys", "list", "--limit", "1")
    assert [row[0] for row in paged.rows()] == [admin["id"]]
    assert paged.err == "# more follow: --offset 1\n"

    shown = gpumeter("keys", "show", customer_key["id"], "--json")
    assert json.loads(shown.out) == customer_key
    revoked = gpumeter("keys", "revoke", customer_key["id"])
    assert revoked.code == 0, revoked.err
    assert "name     acme ci" in revoked.out.splitlines()
    assert client.get("/v1/customers", headers=bearer(acme.secret)).status_code == 401
    [after] = gpumeter("keys", "list", "--kind", "customer").rows()
    assert after[-1] != "-"  # revoked_at shown

    last_admin = gpumeter("keys", "revoke", admin["id"])
    assert (last_admin.code, last_admin.out) == (2, "")
    assert last_admin.err.startswith(
        f"gpumeter keys revoke: API key {admin['id']} is the last active admin key"
    )
    unknown = gpumeter("keys", "show", "00000000-0000-0000-0000-000000000001")
    assert (unknown.code, unknown.err) == (
        2,
        "gpumeter keys show: API key 00000000-0000-0000-0000-000000000001 not found\n",
    )


def test_customers_list_and_show(console: Console, gpumeter: Callable[..., Ran]) -> None:
    assert gpumeter("customers", "list").out == "no customers\n"
    acme = console.customer("Acme", email="billing@acme.example", billing_timezone="Europe/Berlin")
    beta = console.customer("Beta Labs")
    listed = gpumeter("customers", "list")
    assert listed.out.split()[:6] == ["ID", "NAME", "EMAIL", "CURRENCY", "TIMEZONE", "CREATED"]
    assert [row[:5] for row in listed.rows()] == [
        [acme["id"], "Acme", "billing@acme.example", "USD", "Europe/Berlin"],
        [beta["id"], "Beta Labs", "-", "USD", "UTC"],
    ]
    api = console.client.get("/v1/customers", headers=console.headers).json()
    assert json.loads(gpumeter("customers", "list", "--json").out) == api
    shown = gpumeter("customers", "show", acme["id"])
    assert "billing_timezone    Europe/Berlin" in shown.out.splitlines()
    assert json.loads(gpumeter("customers", "show", acme["id"], "--json").out) == acme
    unknown = gpumeter("customers", "show", str(uuid.UUID(int=7)))
    assert (unknown.code, unknown.err) == (
        2,
        f"gpumeter customers show: customer {uuid.UUID(int=7)} not found\n",
    )


def _on_a_terminal(command: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    """Runs ``command`` with its stderr on a pseudo-terminal, as an operator's shell would."""
    leader, follower = pty.openpty()
    chunks: list[bytes] = []

    def read() -> None:
        while True:
            try:
                data = os.read(leader, 65536)
            except OSError:  # EIO: the terminal's other end closed
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        result = subprocess.run(
            command, stdout=subprocess.PIPE, stderr=follower, env=env, text=True, timeout=120
        )
    finally:
        os.close(follower)
        reader.join(timeout=30)
        os.close(leader)
    return result.returncode, result.stdout, b"".join(chunks).decode()


def test_a_terminal_gets_no_info_logs_a_pipe_and_a_log_file_do(
    database_url: str, db: Engine, tmp_path: Path
) -> None:
    """`invoices run` sets up the job queue (info logs from procrastinate): JSON lines on a
    piped stderr, none on a terminal, all of them in --log-file."""
    env = {**os.environ, "GPUMETER_DATABASE_URL": database_url, "GPUMETER_LOG_LEVEL": "info"}
    command = [str(BIN / "gpumeter"), "invoices", "run", "--period", "2026-10"]
    summary = "period 2026-10: 0 customers: 0 drafted, 0 finalized, 0 unchanged"

    piped = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert piped.returncode == 0 and piped.stdout.startswith(summary), piped.stderr
    logged = [json.loads(line) for line in piped.stderr.splitlines() if line.startswith("{")]
    assert {entry["level"] for entry in logged} == {"info"}

    code, out, terminal = _on_a_terminal(command, env)
    assert code == 0 and out.startswith(summary), terminal
    assert '{"ts"' not in terminal

    log_file = tmp_path / "gpumeter.log"
    code, out, terminal = _on_a_terminal(
        [command[0], "--log-file", str(log_file), *command[1:]], env
    )
    assert code == 0 and '{"ts"' not in terminal
    in_file = [json.loads(line) for line in log_file.read_text().splitlines()]
    assert [e["event"] for e in in_file] == [e["event"] for e in logged]


def test_serve_raises_a_low_open_file_limit_to_what_its_connections_need() -> None:
    """A service under systemd or Docker often starts with 1,024 open files, fewer than the
    connections one worker keeps (every agent's, between uploads): the limit is raised towards
    the hard one before uvicorn starts, so the cap refuses connections, not EMFILE."""
    script = (
        "import resource\n"
        "from app.cli.server import CONNECTIONS_PER_WORKER, open_files_for\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))\n"
        "open_files_for(CONNECTIONS_PER_WORKER)\n"
        "print(resource.getrlimit(resource.RLIMIT_NOFILE)[0], hard, CONNECTIONS_PER_WORKER)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    soft, hard, connections = (int(x) for x in done.stdout.split())
    wanted = connections + 1024
    assert soft == (wanted if hard == resource.RLIM_INFINITY else min(wanted, hard))
    assert (soft < wanted) == ("below the" in done.stderr)
