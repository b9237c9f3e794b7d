from decimal import Decimal

from app.billing.core.domain import Assignment, RatingInputs, VoucherTier
from app.billing.core.rating import rate_rental
from app.billing.core.vouchers import (
    EntryKind,
    apply_vouchers,
    balance,
    issue_tier_vouchers,
    issue_voucher,
    open_vouchers,
)

from .factories import DAY, MONTH, healthy, rental, usd_plan

TIERS = (VoucherTier(7, Decimal("5")), VoucherTier(30, Decimal("15")))


def _rated(rental_start: int, rental_end: int | None = None):
    plan = usd_plan(voucher_tiers=TIERS, voucher_validity_days=60)
    r = rental(plan, rental_start=rental_start, rental_end=rental_end)
    segments = {"A": [healthy("A", -10 * DAY, MONTH[1])]}
    return rate_rental(
        RatingInputs([r], [Assignment("r1", "A", rental_start, MONTH[1])], segments, {}, [], MONTH)
    )


def test_35_day_rental_earns_the_15_percent_tier() -> None:
    rated = _rated(rental_start=-5 * DAY)  # started 5 days before this 30-day period
    assert rated.net == Decimal("1792.80")
    [entry] = issue_tier_vouchers([rated], MONTH, issued_at=MONTH[1])
    assert entry.kind is EntryKind.ISSUED
    assert entry.amount == Decimal("268.92")  # 15 % of 1792.80
    assert entry.expires_at == MONTH[1] + 60 * DAY
    assert (entry.voucher_id, entry.source) == ("tier:r1:0", "tier")


def test_tier_thresholds() -> None:
    ten_days = _rated(rental_start=20 * DAY)  # 10 days, net 597.60 -> 5 %
    [entry] = issue_tier_vouchers([ten_days], MONTH, issued_at=MONTH[1])
    assert entry.amount == Decimal("29.88")
    six_days = _rated(rental_start=24 * DAY)
    assert issue_tier_vouchers([six_days], MONTH, issued_at=MONTH[1]) == []


def test_expiry_then_oldest_first_partial_application() -> None:
    ledger = [
        issue_voucher("v1", "c1", Decimal("100.00"), 0, 1, "manual", "goodwill"),  # expires 86400
        issue_voucher("v2", "c1", Decimal("50.00"), 0, 5, "manual", "promo"),
        issue_voucher("v3", "c1", Decimal("80.00"), 0, 3, "tier", "15% tier"),
    ]
    applied, expired = apply_vouchers(open_vouchers(ledger), Decimal("100.00"), 2 * DAY, "inv1")
    assert [(e.voucher_id, e.amount) for e in expired] == [("v1", Decimal("100.00"))]
    assert [(e.voucher_id, e.amount) for e in applied] == [
        ("v3", Decimal("80.00")),
        ("v2", Decimal("20.00")),
    ]
    ledger += applied + expired
    assert balance(ledger) == Decimal("30.00")
    assert [(v.voucher_id, v.remaining) for v in open_vouchers(ledger)] == [
        ("v2", Decimal("30.00"))
    ]
    # After v2 expires, the next invoice writes off its remainder and applies nothing.
    applied, expired = apply_vouchers(open_vouchers(ledger), Decimal("10.00"), 6 * DAY, "inv2")
    assert applied == []
    assert [(e.voucher_id, e.amount) for e in expired] == [("v2", Decimal("30.00"))]
    assert balance(ledger + expired) == Decimal("0")


def test_nothing_is_applied_to_a_zero_due() -> None:
    ledger = [issue_voucher("v1", "c1", Decimal("5.00"), 0, 1, "manual", "x")]
    assert apply_vouchers(open_vouchers(ledger), Decimal("0.00"), 10, "inv") == ([], [])
