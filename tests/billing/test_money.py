from decimal import Decimal

import pytest

from app.core.money import UnknownCurrencyError, round_money, time_amount, zero


def test_half_up_at_the_minor_unit() -> None:
    # 18 s at 1.00/h is exactly 0.005: half-up gives 0.01 where half-even would give 0.00.
    assert time_amount(18, Decimal("1.00"), "USD") == Decimal("0.01")
    assert round_money(Decimal("-0.005"), "USD") == Decimal("-0.01")
    assert round_money(Decimal("0.0049999"), "USD") == Decimal("0.00")


def test_exact_arithmetic_with_ten_decimal_prices() -> None:
    # 2820 s x 2.49 / 3600 = 1.9505 exactly.
    assert time_amount(2820, Decimal("2.49"), "USD") == Decimal("1.95")
    assert time_amount(3600, Decimal("1.0000000005"), "USD") == Decimal("1.00")
    assert time_amount(36000, Decimal("0.0000000005"), "USD") == Decimal("0.00")


def test_jpy_has_no_decimals() -> None:
    # 1 h at 332.5 JPY: half-up gives 333 (half-even would give 332).
    assert time_amount(3600, Decimal("332.5"), "JPY") == Decimal("333")
    assert str(zero("JPY")) == "0"
    assert str(zero("USD")) == "0.00"
    # Three decimals, in steps of ten fils: Stripe takes only amounts ending in 0 for them.
    assert str(round_money(Decimal("1.2345"), "KWD")) == "1.230"
    assert str(round_money(Decimal("1.2350"), "BHD")) == "1.240"
    assert str(round_money(Decimal("-1.2350"), "KWD")) == "-1.240"


def test_unknown_currency_is_an_error() -> None:
    with pytest.raises(UnknownCurrencyError):
        round_money(Decimal(1), "XXX")
