"""Schema migrations through Alembic; the schema is only ever built by migrations."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine

import migrations

# The job queue's own tables (procrastinate's schema, built by a migration from the library's
# SQL) have no models; autogenerate must not take them for tables to drop.
FOREIGN_TABLE_PREFIX = "procrastinate_"
# Partitions of a partitioned table (app.metering.retention: <table>_pYYYYMM, <table>_default)
# and their indexes are the parent's model, not tables of their own.
PARTITION_NAME = re.compile(r"_(p\d{6}|default)$")


def ours(name: str | None, type_: str, parents: Mapping[Any, str | None]) -> bool:
    """Alembic's ``include_name`` hook: compare only objects gpumeter's models own."""
    table = name if type_ == "table" else parents.get("table_name")
    if table is not None and PARTITION_NAME.search(table):
        return False
    return not (type_ == "table" and (name or "").startswith(FOREIGN_TABLE_PREFIX))


def alembic_config(database_url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(Path(migrations.__file__).parent))
    # ConfigParser interpolation: a literal % in a password must be doubled.
    config.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    return config


def upgrade(database_url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(database_url), revision)


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config("postgresql://unused")).get_current_head()


def is_up_to_date(engine: Engine) -> bool:
    with engine.connect() as connection:
        current = MigrationContext.configure(connection).get_current_revision()
    return current == head_revision()
