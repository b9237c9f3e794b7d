"""Throwaway databases on a Postgres server: every test run and benchmark makes its own."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import psycopg
from sqlalchemy.engine import make_url

from app.settings import sqlalchemy_url

LOCAL_SERVER = "postgresql://postgres@127.0.0.1:5432/postgres"


def server_from_environment() -> str:
    """The server of GPUMETER_DATABASE_URL, or the local one benchmarks default to."""
    return os.environ.get("GPUMETER_DATABASE_URL", LOCAL_SERVER)


def with_database(server_url: str, database: str) -> str:
    """``server_url`` pointing at another database on the same server (driver kept)."""
    return make_url(server_url).set(database=database).render_as_string(hide_password=False)


def libpq_dsn(url: str, database: str | None = None) -> str:
    """``url`` (any Postgres URL, SQLAlchemy's included) as a plain DSN for psycopg."""
    plain = make_url(sqlalchemy_url(url)).set(drivername="postgresql")
    if database is not None:
        plain = plain.set(database=database)
    return plain.render_as_string(hide_password=False)


@contextmanager
def scratch_database(
    server_url: str, prefix: str, *, migrated: bool = True, keep: bool = False
) -> Iterator[str]:
    """A new database on ``server_url``'s server, migrated to head unless told otherwise;
    dropped at the end (even with clients still connected) unless ``keep``."""
    from app.core import migrate

    name = f"{prefix}_{secrets.token_hex(4)}"
    with psycopg.connect(libpq_dsn(server_url, "postgres"), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = with_database(server_url, name)
    try:
        if migrated:
            migrate.upgrade(url)
        yield url
    finally:
        if not keep:
            with psycopg.connect(libpq_dsn(server_url, "postgres"), autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def table_bytes(url: str, tables: Sequence[str]) -> dict[str, int]:
    """Each table's pg_total_relation_size: heap, indexes, TOAST, free and dead space; of a
    partitioned table, the sum over its partitions (its own size is zero)."""
    with psycopg.connect(libpq_dsn(url)) as conn:
        sizes: dict[str, int] = {}
        for table in tables:
            row = conn.execute(
                "SELECT coalesce((SELECT sum(pg_total_relation_size(relid))::bigint "
                "FROM pg_partition_tree(%s)), pg_total_relation_size(%s))",
                (table, table),
            ).fetchone()
            assert row is not None, "an aggregate query returns one row"
            sizes[table] = row[0]
        return sizes
