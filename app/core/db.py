"""Engine and sessions: one transaction per request or job, committed at its edge only."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache

from sqlalchemy import Engine, create_engine
from sqlalchemy.orm import Session, sessionmaker

from app.settings import get_settings, sqlalchemy_url

CONNECT_TIMEOUT_S = 5


@lru_cache
def get_engine(url: str | None = None) -> Engine:
    settings = get_settings()
    url = url or settings.database_url
    if not url:
        raise RuntimeError(
            "GPUMETER_DATABASE_URL is not set; run `gpumeter serve` (it starts an embedded "
            "Postgres) or set the URL of your Postgres."
        )
    return create_engine(
        sqlalchemy_url(url),
        pool_size=settings.db_pool_size,
        max_overflow=settings.db_pool_size,
        pool_timeout=settings.db_pool_timeout_s,  # then 503 (app.core.errors), never a hang
        pool_pre_ping=True,
        connect_args={"connect_timeout": CONNECT_TIMEOUT_S},
    )


@lru_cache
def _session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


@contextmanager
def transaction(engine: Engine | None = None) -> Iterator[Session]:
    """A session whose work commits when the block ends cleanly and rolls back otherwise."""
    session = _session_factory(engine or get_engine())()
    try:
        with session.begin():
            yield session
    finally:
        session.close()
