"""docs/billing.md's worked examples, computed by the billing core: the page and the code agree
to the cent (no database)."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

from app.billing.core.domain import Assignment, Migration, RatingInputs, VoucherTier
from app.billing.core.invoice import build_invoice
from app.billing.core.lines import LineKind
from app.billing.core.rating import rate_rental
from app.billing.core.vouchers import OpenVoucher, issue_tier_vouchers
from app.billing.core.whatif import what_if

from .factories import DAY, MONTH, failed, healthy, rental, usd_plan

PAGE = Path(__file__).parents[2] / "docs" / "billing.md"


def examples() -> str:
    """The section, its minus and multiplication signs written as ``-`` and ``x``, its
    paragraphs on one line each."""
    text = PAGE.read_text().replace("\u2212", "-").replace("\u00d7", "x")
    section = text[text.index("## Worked examples") : text.index("## Invoice runs")]
    return "\n".join(" ".join(block.split()) for block in section.split("\n\n"))


def lines_of(rated_lines: object) -> list[tuple[LineKind, Decimal]]:
    return [(line.kind, line.amount) for line in rated_lines]  # type: ignore[attr-defined]


def test_a_failure_and_a_migration_in_two_hours() -> None:
    fail = 1000
    assignments = [Assignment("r1", "A", 0, fail + 2820), Assignment("r1", "B", fail + 2850, 7200)]
    segments = {
        "A": [healthy("A", 0, fail), failed("A", fail, fail + 2820)],
        "B": [healthy("B", 0, 7200)],
    }
    migration = Migration("r1", "A", "B", fail + 2820, fail + 2850)
    two_hours = rental(usd_plan("2.80"), rental_end=7200)
    rated = rate_rental(RatingInputs([two_hours], assignments, segments, {}, [migration], MONTH))
    assert lines_of(rated.lines) == [
        (LineKind.CHARGE, Decimal("5.60")),
        (LineKind.FAILURE_CREDIT, Decimal("-2.20")),
        (LineKind.MIGRATION_CREDIT, Decimal("-0.02")),
    ]
    assert rated.net == Decimal("3.38")
    text = examples()
    for row in (
        "| charge | 7,200 | 5.60 | 5.60 |",
        "| failure credit | 2,820 | 2.19333 | -2.20 |",
        "| migration credit | 30 | 0.02333 | -0.02 |",
        "| net | 4,350 | 3.38333 | **3.38** |",
    ):
        assert row in text


def test_an_increment_rounds_billed_and_credited_seconds_together() -> None:
    plan = usd_plan("3.60", increment_s=60)
    segments = {"A": [healthy("A", 0, 1000), failed("A", 1000, 1100), healthy("A", 1100, 3601)]}
    inputs = RatingInputs(
        [rental(plan, rental_end=3601)], [Assignment("r1", "A", 0, 3601)], segments, {}, [], MONTH
    )
    rated = rate_rental(inputs)
    assert [(x.kind, x.seconds, x.amount) for x in rated.lines] == [
        (LineKind.CHARGE, 3660, Decimal("3.66")),
        (LineKind.FAILURE_CREDIT, 100, Decimal("-0.10")),
    ]
    assert rated.net == Decimal("3.56")
    columns = {
        row.increment_s: (row.with_credits.amount, row.without_credits.amount, row.difference)
        for row in what_if(inputs, manual_recovery_s=0).rows
    }
    assert columns == {
        1: (Decimal("3.50"), Decimal("3.60"), Decimal("0.10")),
        60: (Decimal("3.56"), Decimal("3.66"), Decimal("0.10")),
        3600: (Decimal("7.10"), Decimal("7.20"), Decimal("0.10")),
    }
    text = examples()
    assert "the net **3.56** (3,560 s)" in text
    assert (
        "by exactly the downtime, **0.10**, at every increment: 3.50 against 3.60 at 1 s, " in text
    )
    assert "3.56 against 3.66 at 60 s, 7.10 against 7.20 at 3,600 s." in text


def test_a_month_from_gpu_time_to_the_amount_due() -> None:
    f, end = 10 * DAY, MONTH[1]
    tiers = (VoucherTier(7, Decimal(5)), VoucherTier(30, Decimal(15)))
    plan = usd_plan("2.49", cap="1500", voucher_tiers=tiers)
    segments = {"A": [healthy("A", 0, f), failed("A", f, f + 2820)], "B": [healthy("B", 0, end)]}
    assignments = [Assignment("r1", "A", 0, f + 2820), Assignment("r1", "B", f + 2850, end)]
    migration = Migration("r1", "A", "B", f + 2820, f + 2850)
    rated = rate_rental(RatingInputs([rental(plan)], assignments, segments, {}, [migration], MONTH))
    finalized_at = end + 6 * 3600
    voucher = OpenVoucher("v1", "c1", end + 90 * DAY, Decimal("50.00"))
    invoice = build_invoice(
        "i1", "c1", "USD", [rated], [voucher], finalized_at, Decimal("0.19"), balance=Decimal(10)
    )
    assert lines_of(invoice.lines) == [
        (LineKind.CHARGE, Decimal("1792.80")),
        (LineKind.FAILURE_CREDIT, Decimal("-1.95")),
        (LineKind.MIGRATION_CREDIT, Decimal("-0.02")),
        (LineKind.CAP, Decimal("-292.48")),
        (LineKind.VOUCHER, Decimal("-50.00")),
        (LineKind.TAX, Decimal("275.19")),
        (LineKind.PREPAID_BALANCE, Decimal("-10.00")),
    ]
    assert invoice.total == Decimal("1713.54")
    [earned] = issue_tier_vouchers([rated], MONTH, finalized_at)
    assert (earned.amount, earned.expires_at) == (Decimal("224.75"), finalized_at + 90 * DAY)
    text = examples()
    for row in (
        "| charge | 720 h x 2.49 | 1,792.80 |",
        "| failure credit | 2,820 s x 2.49 / 3600 = 1.9505 | -1.95 |",
        "| migration credit | 30 s x 2.49 / 3600 = 0.02075 | -0.02 |",
        "| usage (GPU time less credits) | | 1,790.83 |",
        "| monthly cap | allowance 1,500 x 2,589,150 / 2,592,000 = 1,498.3507 → 1,498.35 "
        "| -292.48 |",
        "| vouchers | the 50.00 voucher, valid at finalization | -50.00 |",
        "| subtotal | | 1,448.35 |",
        "| tax 19 % | 1,448.35 x 0.19 = 275.1865 | 275.19 |",
        "| total | | 1,723.54 |",
        "| prepaid balance applied | min(10.00, 1,723.54) | -10.00 |",
        "| **amount due** | | **1,713.54** |",
    ):
        assert row in text
    assert "1,498.35 x 15 % = 224.7525 → a **224.75** voucher, valid 90 days" in text
