"""Declarative base shared by every domain package's models."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from enum import StrEnum
from typing import Any, ClassVar

from sqlalchemy import BigInteger, DateTime, Enum, MetaData, Numeric, func
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# Stable constraint names, so Alembic migrations name what they create and drop.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# Money: 18 digits before the point is far beyond any invoice; prices carry 10 places.
Money = Numeric(28, 10)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map: ClassVar[dict[Any, Any]] = {
        datetime: DateTime(timezone=True),
        Decimal: Money,
        int: BigInteger,
    }


class Timestamped:
    created_at: Mapped[datetime] = mapped_column(server_default=func.now())


def pg_enum(enum: type[StrEnum], name: str) -> Enum:
    """A Postgres enum stored by value ("rentable"), not by Python member name."""
    return Enum(enum, name=name, values_callable=lambda members: [m.value for m in members])
