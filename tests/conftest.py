"""Test databases: real Postgres only, built by the migrations, fresh for every test run.

The server is the one in GPUMETER_DATABASE_URL when set (CI uses the machine's Postgres),
otherwise an embedded Postgres started for this run. Each run (and each xdist worker)
creates its own database and drops it at the end.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import settings
from psycopg.errors import DeadlockDetected
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.exc import OperationalError

from app.auth.models import KeyKind
from app.auth.service import issue_key
from app.cli import main as cli_main
from app.core.db import transaction
from app.core.embedded_pg import embedded_postgres
from app.core.scratch_db import scratch_database
from app.main import create_app
from app.settings import get_settings, sqlalchemy_url
from app.wiring import install as install_subscribers
from tests.harness import Console, Ran

SERVER_URL_ENV = "GPUMETER_DATABASE_URL"
# The run's signing secret, random like a deployment's; the servers tests start inherit it.
os.environ.setdefault("GPUMETER_SECRET_KEY", secrets.token_urlsafe(32))
# No signup credit unless a test grants one (tests/balances): every other test's invoice
# figures are written for customers without a prepaid balance. The servers tests start inherit it.
os.environ.setdefault("GPUMETER_TRIAL_CREDIT", "0")
get_settings.cache_clear()  # the imports above may have read the settings already

# Properties check values, not speed: on a loaded CI machine hypothesis's default 200 ms
# deadline per example fails them spuriously. In CI the examples are derandomized, so a run
# is reproducible and a property fails on the change that broke it, not on a lucky draw;
# a local run keeps exploring new examples.
settings.register_profile("gpumeter", deadline=None, derandomize=os.environ.get("CI") == "true")
settings.load_profile("gpumeter")


@pytest.fixture(scope="session", autouse=True)
def subscribers() -> None:
    """The event subscribers every entry point registers (app factory, worker, CLI)."""
    install_subscribers()


@pytest.fixture(scope="session")
def pg_server_url() -> Iterator[str]:
    """URL of a Postgres server this run may create databases on."""
    configured = os.environ.get(SERVER_URL_ENV)
    if configured:
        yield configured
        return
    data_dir = Path(tempfile.mkdtemp(prefix="gpumeter-test-pg-"))
    try:
        with embedded_postgres(data_dir) as url:  # stops it, bounded and checked
            yield url
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def database_url(pg_server_url: str, worker_id: str) -> Iterator[str]:
    """A new database for this run (and xdist worker), migrated to head."""
    with scratch_database(pg_server_url, f"gpumeter_test_{worker_id}") as url:
        yield url


@pytest.fixture(scope="session")
def worker_id(request: pytest.FixtureRequest) -> str:
    """xdist's worker id ("gw0", ...) or "main" without xdist."""
    return getattr(request.config, "workerinput", {}).get("workerid", "main")


@pytest.fixture(scope="session")
def engine(database_url: str) -> Iterator[Engine]:
    engine = create_engine(sqlalchemy_url(database_url), pool_size=5)
    yield engine
    engine.dispose()


EMPTYING_ATTEMPTS = 5


@pytest.fixture
def db(engine: Engine) -> Engine:
    """The run's database, emptied before the test (schema and migrations stay)."""
    return _emptied(engine)


@pytest.fixture(scope="module")
def module_db(engine: Engine) -> Engine:
    """The run's database, emptied once for a module whose tests share what it seeds (many
    read-only cases over one world). Such a module is one xdist group
    (``pytest.mark.xdist_group``, CI runs ``--dist loadgroup``), so no other module's test
    empties the database between its tests, and its tests do not use ``db``."""
    return _emptied(engine)


def _emptied(engine: Engine) -> Engine:
    """The previous test's processes (a server or queue worker still finishing its last
    transaction) can hold a table the emptying also locks: Postgres then ends one side as a
    deadlock victim. That side is this emptying, rolled back whole, so trying again is safe.
    """
    attempts = 0
    while True:
        attempts += 1
        try:
            _empty_tables(engine)
            return engine
        except OperationalError as error:
            if not isinstance(error.orig, DeadlockDetected) or attempts == EMPTYING_ATTEMPTS:
                raise


# Every sequence that has handed out a value since its last reset, back to its start.
_RESTART_USED_SEQUENCES = text(
    "SELECT setval(format('%I', sequencename)::regclass, start_value, false) "
    "FROM pg_sequences WHERE schemaname = 'public' AND last_value IS NOT NULL"
)
# Up to this many rows a DELETE empties a table faster than TRUNCATE, which makes new files
# for the table and its indexes (0.15-0.25 s per test here, for a handful of rows).
_DELETE_UP_TO_ROWS = 5000


def _empty_tables(engine: Engine) -> None:
    """Empties every table that holds rows and restarts every sequence that moved: the rest
    already are as new. Small tables are DELETEd with triggers and foreign keys off (the
    session is a replica's for this transaction: no immutability trigger refuses, and order
    does not matter), large ones TRUNCATEd."""
    with engine.begin() as conn:
        tables = conn.scalars(
            text(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public' "
                "AND tablename <> 'alembic_version'"
            )
        ).all()
        if not tables:
            return
        rows = " UNION ALL ".join(
            f"SELECT '{t}', (SELECT count(*) FROM (SELECT FROM ONLY {t} "
            f"LIMIT {_DELETE_UP_TO_ROWS + 1}) AS r)"
            for t in tables
        )
        counted = [(t, n) for t, n in conn.execute(text(rows)) if n > 0]
        large = sorted(t for t, n in counted if n > _DELETE_UP_TO_ROWS)
        if large:
            conn.execute(text(f"TRUNCATE {', '.join(large)} CASCADE"))
        conn.execute(text("SET LOCAL session_replication_role = replica"))
        for table, n in counted:
            if n <= _DELETE_UP_TO_ROWS:
                conn.execute(text(f"DELETE FROM ONLY {table}"))
        conn.execute(_RESTART_USED_SEQUENCES)


# --- the API harness: the ASGI app over the run's database, an admin key, the console --------


@pytest.fixture
def app(db: Engine) -> FastAPI:
    return _service(db)


def _service(engine: Engine) -> FastAPI:
    """The service without its in-process queue worker (tests that need one start it)."""
    return create_app(engine, worker=False)


def _admin_key(engine: Engine) -> str:
    with transaction(engine) as session:
        return issue_key(session, KeyKind.ADMIN, "test admin").secret


@pytest.fixture
def client(app: FastAPI) -> Iterator[TestClient]:
    with TestClient(app) as test_client:
        yield test_client


@pytest.fixture
def admin_key(db: Engine) -> str:
    return _admin_key(db)


@pytest.fixture
def console(client: TestClient, admin_key: str) -> Console:
    return Console(client, admin_key)


@pytest.fixture(scope="module")
def module_console(module_db: Engine) -> Iterator[Console]:
    """``console`` over ``module_db``: one app, client and admin key for the module."""
    with TestClient(_service(module_db)) as test_client:
        yield Console(test_client, _admin_key(module_db))


# --- the command line, in this process ----------------------------------------------------------


@pytest.fixture
def gpumeter(
    database_url: str,
    db: Engine,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Callable[..., Ran]]:
    """Runs `gpumeter ARGS...` through the CLI's ``main`` on the test database (emptied first)
    and returns its exit status and output."""
    monkeypatch.setenv(SERVER_URL_ENV, database_url)
    get_settings.cache_clear()
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level

    def run(*argv: str) -> Ran:
        capsys.readouterr()
        try:
            code: int | str | None = cli_main(list(argv))
        except SystemExit as exit_:  # argparse refusing an argument
            code = exit_.code
        out, err = capsys.readouterr()
        return Ran(code, out, err)

    yield run
    root.handlers[:] = handlers  # main pointed the logs at the captured stderr
    root.setLevel(level)
    get_settings.cache_clear()  # read again once the environment is restored
