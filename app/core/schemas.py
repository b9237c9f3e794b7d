"""Field types shared by the API schemas."""

from __future__ import annotations

import unicodedata
import zoneinfo
from decimal import Decimal
from typing import Annotated, Any

from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field, field_validator

from app.core.epoch import check_in_range
from app.core.money import MAX_AMOUNT, MAX_HOURLY_PRICE, minor_units


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


# Control characters, line and paragraph separators, and invisible format characters: a bidi
# override (U+202E) makes "gpu-cod.exe" read otherwise, a zero-width space (U+200B) makes two
# names that look the same differ.
_HIDDEN = frozenset({"Cc", "Cf", "Zl", "Zp"})
_JOINERS = frozenset("\u200c\u200d")  # ZWNJ and ZWJ


def one_line(text: str) -> str:
    """Names are one line of visible text: no control, line-separator or invisible format
    character (Unicode categories Cc, Zl, Zp, Cf). A joiner (ZWNJ, ZWJ) is allowed between two
    visible non-ASCII characters, where Persian, Indic scripts and emoji sequences need it."""
    for i, char in enumerate(text):
        if unicodedata.category(char) in _HIDDEN and not _joins(text, i):
            name = unicodedata.name(char, "") or _control_name(char)
            raise ValueError(
                f"must be one line of visible text: U+{ord(char):04X} ({name}) at position "
                f"{i + 1} is a control or invisible format character"
            )
    return text


# The C0 controls' names (Unicode gives them none): an error names the NUL it found.
_C0 = (  # noqa: SIM905 - the names as a reader knows them, in code order
    "NUL SOH STX ETX EOT ENQ ACK BEL BS HT LF VT FF CR SO SI "
    "DLE DC1 DC2 DC3 DC4 NAK SYN ETB CAN EM SUB ESC FS GS RS US"
).split()


def _control_name(char: str) -> str:
    code = ord(char)
    return _C0[code] if code < len(_C0) else "DEL" if code == 0x7F else "a control character"


def _joins(text: str, i: int) -> bool:
    if text[i] not in _JOINERS or not 0 < i < len(text) - 1:
        return False
    return all(
        not c.isascii() and unicodedata.category(c) not in _HIDDEN and not c.isspace()
        for c in (text[i - 1], text[i + 1])
    )


CurrencyCode = Annotated[str, Field(min_length=3, max_length=3), AfterValidator(_known_currency)]
TimeZoneName = Annotated[str, Field(max_length=64), AfterValidator(_known_timezone)]
# Hourly prices: exact decimals with at most 10 places; never negative; a month of the largest
# rental at one, with tax, fits an invoice amount (``MAX_HOURLY_PRICE``).
HourlyPrice = Annotated[Decimal, Field(ge=0, le=MAX_HOURLY_PRICE, max_digits=28, decimal_places=10)]
Amount = Annotated[Decimal, Field(gt=0, le=MAX_AMOUNT, max_digits=28, decimal_places=10)]
Name = Annotated[str, Field(min_length=1, max_length=200), AfterValidator(one_line)]
# A time the service takes: with its zone, 1970-01-01 to 2199-12-31 in UTC (``app.core.epoch``).
Instant = Annotated[AwareDatetime, AfterValidator(check_in_range)]


class Schema(BaseModel):
    """Base of request and response bodies: unknown fields are an error, not silently dropped,
    and text must be storable (Postgres text holds no NUL and no lone surrogate)."""

    model_config = ConfigDict(extra="forbid", from_attributes=True)

    @field_validator("*", mode="after")
    @classmethod
    def _storable_text(cls, value: Any) -> Any:
        if isinstance(value, str) and not storable_text(value):
            raise ValueError("must be valid UTF-8 text without NUL characters")
        return value


def _refuse_null(value: Any) -> Any:
    if value is None:
        raise ValueError("may be left out, but not null")
    return value


def not_null(*fields: str) -> Any:
    """For a partial update: these fields may be left out, but not set to null (their column
    cannot be empty). Only explicit values are validated, so leaving them out stays fine."""
    return field_validator(*fields, mode="before")(_refuse_null)


def storable_text(value: str) -> bool:
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return "\x00" not in value
