"""Engine and sessions: one transaction per request or job, committed at its edge only.

No ping per checkout (``pool_pre_ping`` cost every request a round trip). A pooled connection
is checked only when it is suspect (``_check_suspect``): its socket is readable while it sat
idle (the server said something unasked: a termination or restart sends its FATAL and closes,
so the socket shows it at once, at no cost), or it sat idle longer than
``GPUMETER_DB_IDLE_PING_S`` (a path that died silently). A suspect that fails its ping is
replaced before the request sees it. A connection that breaks during a request is a 503 with
``Retry-After`` (``app.core.errors``) and SQLAlchemy then recycles every pooled connection
older than the failure, so a restarted Postgres costs at most one such answer per process.
"""

from __future__ import annotations

import re
import select
import time
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import lru_cache
from typing import Any, cast

import psycopg
from sqlalchemy import (
    ColumnElement,
    Dialect,
    Engine,
    TextClause,
    all_,
    any_,
    create_engine,
    event,
    exc,
    text,
)
from sqlalchemy import (
    cast as sql_cast,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import QueryableAttribute, Session, sessionmaker
from sqlalchemy.pool import ConnectionPoolEntry

from app.settings import get_settings, sqlalchemy_url

CONNECT_TIMEOUT_S = 5
# A column as a query names it: a mapped attribute, or a column of a select.
ColumnLike = ColumnElement[Any] | QueryableAttribute[Any]


@lru_cache
def get_engine(url: str | None = None) -> Engine:
    settings = get_settings()
    url = url or settings.database_url
    if not url:
        raise RuntimeError(
            "GPUMETER_DATABASE_URL is not set; run `gpumeter serve` (it starts an embedded "
            "Postgres) or set the URL of your Postgres."
        )
    engine = create_engine(
        sqlalchemy_url(url),
        pool_size=settings.db_pool_size,
        max_overflow=settings.db_pool_size,
        pool_timeout=settings.db_pool_timeout_s,  # then 503 (app.core.errors), never a hang
        connect_args={"connect_timeout": CONNECT_TIMEOUT_S},
    )
    install_liveness_checks(engine, settings.db_idle_ping_s)
    return engine


_IDLE_SINCE = "gpumeter_idle_since"


def install_liveness_checks(engine: Engine, idle_ping_s: float) -> None:
    """Ping a pooled connection on checkout only when it is suspect (see the module doc)."""

    def checked_in(dbapi_connection: Any, entry: ConnectionPoolEntry) -> None:
        entry.info[_IDLE_SINCE] = time.monotonic()

    def check_suspect(dbapi_connection: Any, entry: ConnectionPoolEntry, proxy: Any) -> None:
        idle_since = entry.info.pop(_IDLE_SINCE, None)
        if idle_since is None:  # a new connection
            return
        if time.monotonic() - idle_since < idle_ping_s and not _readable(dbapi_connection):
            return
        try:
            alive = engine.dialect.do_ping(dbapi_connection)
        except engine.dialect.loaded_dbapi.Error:
            alive = False
        if not alive:
            raise exc.DisconnectionError("pooled connection is dead; the pool opens another")

    event.listen(engine, "checkin", checked_in)
    event.listen(engine, "checkout", check_suspect)


def _readable(dbapi_connection: Any) -> bool:
    """Whether the server sent anything to this idle connection (or closed it)."""
    try:
        ready, _, _ = select.select([dbapi_connection.fileno()], [], [], 0)
    except (OSError, ValueError):
        return True  # closed or unusable: suspect
    return bool(ready)


@lru_cache
def _session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def begun_session(engine: Engine) -> Session:
    """A session with its transaction begun, for a caller that commits (or closes, rolling
    back) at an edge ``transaction`` cannot span (an ASGI middleware: app.core.idempotency)."""
    session = _session_factory(engine)()
    session.begin()
    return session


@contextmanager
def transaction(engine: Engine | None = None) -> Iterator[Session]:
    """A session whose work commits when the block ends cleanly and rolls back otherwise."""
    session = _session_factory(engine or get_engine())()
    try:
        with session.begin():
            yield session
    finally:
        session.close()


def one_of(column: ColumnLike, values: Collection[Any]) -> ColumnElement[bool]:
    """``column = ANY(:values)``: one array parameter however many values. ``IN`` binds one
    parameter per value, which SQLAlchemy renders and psycopg parses one by one: a Slurm
    snapshot's 10,000 job ids cost about a second of CPU that way."""
    return column == any_(sql_cast(list(values), ARRAY(column.type)))


def none_of(column: ColumnLike, values: Collection[Any]) -> ColumnElement[bool]:
    """``column <> ALL(:values)`` (``NOT IN``, as ``one_of``); true for every row when
    ``values`` is empty."""
    return column != all_(sql_cast(list(values), ARRAY(column.type)))


def lock_keys(session: Session, keys: Iterable[str]) -> None:
    """Transaction-scoped advisory locks on ``keys``, in one statement and in sorted order, so
    two transactions locking overlapping sets never deadlock on each other."""
    session.execute(*lock_keys_statement(keys))


_LOCK_KEYS = text(
    "SELECT pg_advisory_xact_lock(hashtextextended(k, 0)) FROM unnest(CAST(:keys AS text[])) AS k"
)


def lock_keys_statement(keys: Iterable[str]) -> Statement:
    """``lock_keys`` as a statement, for ``pipelined``."""
    return _LOCK_KEYS, {"keys": sorted(keys)}


# A statement for ``pipelined``: SQL (``text()``, ``:name`` parameters) and its values.
Statement = tuple[TextClause, Mapping[str, Any]]


_DRIVER_PARAMETER = re.compile(r"%\((\w+)\)s")


@lru_cache(maxsize=512)
def _driver_sql(sql: str, dialect: Dialect) -> str:
    """``text()`` SQL in the driver's parameter style, every parameter sent in binary
    (``%(name)b``), compiled once."""
    return _DRIVER_PARAMETER.sub(r"%(\1)b", str(text(sql).compile(dialect=dialect)))


def pipelined(
    session: Session, statements: Sequence[Statement | None]
) -> list[list[tuple[Any, ...]]]:
    """Run the statements in order in the session's transaction, all sent at once and
    answered at once (psycopg's pipeline mode): one round trip instead of one each. Returns
    each statement's rows ([] for None and for statements without rows). Each statement sees
    the effects of the ones before it, as if run one by one; a failing one raises (as
    SQLAlchemy's DBAPIError, so the app's handlers apply) and the transaction rolls back.

    Parameters and rows travel in Postgres's binary format. In the text format psycopg
    escapes every array element in Python (a regex per element; a bytea element as hex,
    then escaped again) and Postgres parses the hex back: for ingest's statements, arrays
    over a group's GPUs, that was a third of the writer's Python and a fifth of Postgres's
    CPU per batch (``bench/HISTORY.md``)."""
    session.flush()  # ORM changes first: the statements below bypass the session
    connection = session.connection()
    raw: psycopg.Connection[Any] = connection.connection.driver_connection  # type: ignore[assignment]
    dialect = connection.dialect
    compiled = [None if s is None else (_driver_sql(s[0].text, dialect), s[1]) for s in statements]
    try:
        with raw.pipeline():
            cursors = []
            for item in compiled:
                cursor = None
                if item is not None:
                    cursor = raw.cursor(binary=True)
                    cursor.execute(item[0], item[1])
                cursors.append(cursor)
        return [[] if c is None or c.description is None else c.fetchall() for c in cursors]
    except psycopg.Error as error:
        disconnected = dialect.is_disconnect(cast(Any, error), cast(Any, raw), None)
        if disconnected:
            connection.invalidate(error)
        sql = "; ".join(item[0] for item in compiled if item is not None)
        raise exc.DBAPIError.instance(
            sql, None, error, psycopg.Error, connection_invalidated=disconnected
        ) from error
