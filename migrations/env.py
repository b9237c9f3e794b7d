"""Alembic environment: the URL comes from the caller's config or from the service settings."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, pool

from app.core.migrate import ours
from app.models import Base
from app.settings import get_settings, sqlalchemy_url

config = context.config


def _url() -> str:
    url = config.get_main_option("sqlalchemy.url") or get_settings().database_url
    if not url:
        raise RuntimeError("Set GPUMETER_DATABASE_URL to the Postgres to migrate.")
    return sqlalchemy_url(url)


def run_migrations_online() -> None:
    engine = create_engine(_url(), poolclass=pool.NullPool)
    with engine.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=Base.metadata,
            compare_type=True,
            include_name=ours,
        )
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


run_migrations_online()
