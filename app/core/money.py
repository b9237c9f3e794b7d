"""Exact money arithmetic for billing.

Amounts are ``Decimal`` values with exactly the currency's ISO 4217 minor-unit exponent
(USD ``12.34``, JPY ``1234``). Intermediate values are exact ``Fraction``s, so rounding
happens exactly once, at the line, with ROUND_HALF_UP (ties away from zero).

Three-decimal currencies (BHD, JOD, KWD, OMR, TND) round to the nearest ten of their minor
unit (KWD ``12.340``): Stripe accepts only such amounts for them, and an amount we bill must
be one Stripe can charge exactly, or its totals would not match ours.

API:
    minor_units(currency) -> int
    quantum(currency) -> Fraction                  # the rounding step, 0.01 for USD
    round_money(value, currency) -> Decimal        # the single rounding step
    time_amount(seconds, price_per_hour, currency) -> Decimal   # seconds x price / 3600
    zero(currency) -> Decimal
    display(amount, currency) -> str               # "€1,852.56", "CHF 12.00", "-$3.10"
"""

from decimal import Decimal
from fractions import Fraction

# ISO 4217 minor units for the currencies we sell in; unknown codes are an error, never a guess.
_MINOR_UNITS: dict[str, int] = {
    "AUD": 2,
    "BHD": 3,
    "BRL": 2,
    "CAD": 2,
    "CHF": 2,
    "CLP": 0,
    "CNY": 2,
    "CZK": 2,
    "DKK": 2,
    "EUR": 2,
    "GBP": 2,
    "HKD": 2,
    "INR": 2,
    "ISK": 0,
    "JOD": 3,
    "JPY": 0,
    "KRW": 0,
    "KWD": 3,
    "NOK": 2,
    "NZD": 2,
    "OMR": 3,
    "PLN": 2,
    "SEK": 2,
    "SGD": 2,
    "TND": 3,
    "USD": 2,
    "VND": 0,
}

# Minor units per rounding step where it is not one (Stripe: three-decimal currencies).
_STEP: dict[str, int] = {code: 10 for code, units in _MINOR_UNITS.items() if units == 3}

SECONDS_PER_HOUR = 3600

# The largest amount the API takes (a top-up, a budget, a cap) and the largest balance a ledger
# may hold, in the currency's major unit: 10^18 minor units at most (three decimals), below a
# BIGINT's 9.2 x 10^18, so no sum of two ledger values can leave the column's range.
MAX_AMOUNT = Decimal(10) ** 15

# Every invoice amount stored is below this (the ``Money`` columns, Numeric(28, 10), hold 18
# digits before the point).
MONEY_LIMIT = Decimal(10) ** 18
# The highest price per GPU-hour the API takes: a month (745 h with a DST hour) of the largest
# rental (100,000 GPUs, ``app.rentals``) at it, with tax (below 100 %), is 1.49 x 10^17, so one
# rental's lines and its invoice's tax always fit ``MONEY_LIMIT`` (a test pins the arithmetic).
MAX_HOURLY_PRICE = Decimal(10) ** 9


class UnknownCurrencyError(ValueError):
    """Raised for a currency code missing from the minor-unit table."""


def minor_units(currency: str) -> int:
    try:
        return _MINOR_UNITS[currency]
    except KeyError:
        raise UnknownCurrencyError(f"unknown currency {currency!r}") from None


def quantum(currency: str) -> Fraction:
    """The smallest amount a rounded value moves by: 0.01 USD, 1 JPY, 0.010 KWD."""
    return Fraction(_STEP.get(currency, 1), 10 ** minor_units(currency))


def round_money(value: Decimal | Fraction | int, currency: str) -> Decimal:
    """Round an exact value to the currency's quantum, half-up (away from zero on ties)."""
    exponent, step = minor_units(currency), _STEP.get(currency, 1)
    scaled = Fraction(value) * 10**exponent / step
    # floor(|x| + 1/2) is half-up on the magnitude; the sign is re-applied afterwards.
    magnitude = int(abs(scaled) + Fraction(1, 2))
    units = (-magnitude if scaled < 0 else magnitude) * step
    return Decimal(units).scaleb(-exponent)


def time_amount(seconds: int, price_per_hour: Decimal, currency: str) -> Decimal:
    """The rounded amount for ``seconds`` of usage at ``price_per_hour``."""
    return round_money(Fraction(seconds) * Fraction(price_per_hour) / SECONDS_PER_HOUR, currency)


def zero(currency: str) -> Decimal:
    return round_money(0, currency)


def to_minor(amount: Decimal, currency: str) -> int:
    """``amount`` as a whole number of the currency's minor units (USD 12.34 -> 1234); an
    amount the currency cannot bill exactly (USD 0.001, KWD 1.235) is a ValueError."""
    if round_money(amount, currency) != amount:
        raise ValueError(f"{amount} is not a whole amount of {currency} (step {quantum(currency)})")
    return int(amount.scaleb(minor_units(currency)))


def from_minor(units: int, currency: str) -> Decimal:
    """A count of minor units as the currency's Decimal amount (1234 USD cents -> 12.34)."""
    return Decimal(units).scaleb(-minor_units(currency))


# Symbols printable in a PDF's core fonts (cp1252) too; others are written as the ISO code.
_SYMBOLS = {"USD": "$", "EUR": "€", "GBP": "£", "JPY": "¥"}


def display(amount: Decimal | str, currency: str) -> str:
    """An amount for people to read, at the currency's minor unit with thousands separators
    (rounded by ``round_money`` only if it carries more places)."""
    value = round_money(Decimal(amount), currency)
    digits = f"{abs(value):,.{minor_units(currency)}f}"
    symbol = _SYMBOLS.get(currency)
    text = f"{symbol}{digits}" if symbol else f"{currency} {digits}"
    return f"-{text}" if value < 0 else text
