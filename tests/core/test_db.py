"""Pooled connections are not pinged per request, yet a dead one never reaches a request."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import BigInteger, Engine, column, create_engine, func, select, text
from sqlalchemy.exc import DBAPIError

from app.core.db import install_liveness_checks, none_of, one_of, pipelined, transaction
from app.settings import sqlalchemy_url


@pytest.fixture
def checked_engine(database_url: str) -> Iterator[Engine]:
    engine = create_engine(sqlalchemy_url(database_url), pool_size=2)
    install_liveness_checks(engine, idle_ping_s=3600)
    yield engine
    engine.dispose()


def _backend(engine: Engine) -> int:
    with transaction(engine) as session:
        return int(session.scalar(text("SELECT pg_backend_pid()")) or 0)


def test_a_pooled_connection_the_server_ended_is_replaced_before_use(
    checked_engine: Engine, db: Engine
) -> None:
    first = _backend(checked_engine)
    assert _backend(checked_engine) == first  # reused from the pool
    with transaction(db) as session:  # as a Postgres restart or an operator would
        assert session.scalar(text("SELECT pg_terminate_backend(:pid, 5000)"), {"pid": first})
    second = _backend(checked_engine)  # no error: the dead one was noticed and replaced
    assert second != first


def test_pipelined_statements_answer_in_order_and_see_each_other(db: Engine) -> None:
    with transaction(db) as session:
        results = pipelined(
            session,
            [
                (text("CREATE TEMP TABLE t (n int) ON COMMIT DROP"), {}),
                None,
                (
                    text("INSERT INTO t SELECT unnest(CAST(:ns AS int[])) RETURNING n"),
                    {"ns": [1, 2]},
                ),
                (text("SELECT sum(n) FROM t"), {}),
            ],
        )
    assert results == [[], [], [(1,), (2,)], [(3,)]]


def test_a_failing_pipelined_statement_raises_as_sqlalchemy_does(db: Engine) -> None:
    with pytest.raises(DBAPIError, match="division by zero"), transaction(db) as session:
        pipelined(session, [(text("SELECT 1"), {}), (text("SELECT 1 / 0"), {})])


@pytest.mark.parametrize("count", [0, 1, 20_000])
def test_one_of_and_none_of_bind_one_array_however_many_values(db: Engine, count: int) -> None:
    """``one_of`` / ``none_of`` are ``IN`` / ``NOT IN`` with one array parameter: the same
    rows for no value (none of them / all of them), one, or 20,000 (beyond the 65,535
    parameters a statement may bind, had each value one)."""
    numbers = column("n", BigInteger)
    series = select(numbers).select_from(text("generate_series(1, 30000) AS g(n)"))
    values = [v * 3 for v in range(1, count + 1)]
    with transaction(db) as session:
        inside = session.scalars(series.where(one_of(numbers, values))).all()
        outside = session.scalar(
            select(func.count()).select_from(series.where(none_of(numbers, values)).subquery())
        )
    assert sorted(inside) == [v for v in values if v <= 30000]
    assert outside == 30000 - len(inside)
