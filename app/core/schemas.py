"""Field types shared by the API schemas."""

from __future__ import annotations

import zoneinfo
from decimal import Decimal
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from app.core.money import minor_units


def _known_currency(code: str) -> str:
    code = code.upper()
    minor_units(code)  # raises ValueError naming the code when it is not ISO 4217
    return code


def _known_timezone(name: str) -> str:
    try:
        zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ValueError(
            f"unknown IANA time zone {name!r}, e.g. 'Europe/Berlin' or 'UTC'"
        ) from None
    return name


CurrencyCode = Annotated[str, Field(min_length=3, max_length=3), AfterValidator(_known_currency)]
TimeZoneName = Annotated[str, Field(max_length=64), AfterValidator(_known_timezone)]
# Hourly prices: exact decimals with at most 10 places; never negative.
HourlyPrice = Annotated[Decimal, Field(ge=0, max_digits=28, decimal_places=10)]
Amount = Annotated[Decimal, Field(gt=0, max_digits=28, decimal_places=10)]
Name = Annotated[str, Field(min_length=1, max_length=200)]


class Schema(BaseModel):
    """Base of request and response bodies: unknown fields are an error, not silently dropped."""

    model_config = ConfigDict(extra="forbid", from_attributes=True)
