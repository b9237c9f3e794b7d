"""The schema is built only by migrations, and they agree with the models."""

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine

from app.core.migrate import head_revision, is_up_to_date, ours
from app.models import Base


def test_autogenerate_finds_no_difference_between_models_and_migrations(engine: Engine) -> None:
    with engine.connect() as connection:
        context = MigrationContext.configure(
            connection, opts={"compare_type": True, "include_name": ours}
        )
        diff = compare_metadata(context, Base.metadata)
    assert diff == []


def test_database_is_at_head(engine: Engine) -> None:
    assert head_revision() is not None
    assert is_up_to_date(engine)
