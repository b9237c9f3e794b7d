from decimal import Decimal

from app.billing.core.domain import Assignment, PlanTerms, PricePoint, RatingInputs
from app.billing.core.evidence import evidence_text, xid_of
from app.billing.core.invoice import build_invoice
from app.billing.core.lines import InvoiceLine, LineKind
from app.billing.core.rating import rate_rental
from app.billing.core.vouchers import issue_voucher, open_vouchers

from .factories import MONTH, failed, healthy, rental, usd_plan


def _month_on_a():
    segments = {"A": [healthy("A", 0, MONTH[1]), failed("A", 100, 118)]}
    assignments = [Assignment("r1", "A", 0, MONTH[1])]
    return rate_rental(RatingInputs([rental(usd_plan())], assignments, segments, {}, [], MONTH))


def test_tax_on_lines_after_vouchers_total_is_sum_of_lines() -> None:
    vouchers = open_vouchers([issue_voucher("v1", "c1", Decimal("100.00"), 0, 90, "manual", "x")])
    invoice = build_invoice(
        "inv1", "c1", "USD", [_month_on_a()], vouchers, MONTH[1], Decimal("0.19")
    )
    kinds = [(line.kind, line.amount) for line in invoice.lines]
    assert kinds == [
        (LineKind.CHARGE, Decimal("1792.80")),
        (LineKind.FAILURE_CREDIT, Decimal("-0.01")),  # 18 s x 2.49 / 3600 = 0.01245
        (LineKind.VOUCHER, Decimal("-100.00")),
        (LineKind.TAX, Decimal("321.63")),  # 0.19 x 1692.79 = 321.6301
    ]
    assert invoice.total == Decimal("2014.42") == sum(line.amount for line in invoice.lines)
    assert [(a.voucher_id, a.amount) for a in invoice.voucher_applications] == [
        ("v1", Decimal("100.00"))
    ]


def test_credit_rounding_keeps_the_net_at_billable_seconds_times_price() -> None:
    # 18 s at 1.00/h is 0.005 per failure: rounded on its own each would be 0.01 and the net
    # 0.26. The net must be 964 billable s x 1.00/h = 0.2677 -> 0.27, so the credits share
    # 0.01 by largest remainder (a tie: the earlier incident takes it).
    segments = {"A": [healthy("A", 0, 1000), failed("A", 100, 118), failed("A", 200, 218)]}
    plan = usd_plan("1.00")
    rated = rate_rental(
        RatingInputs([rental(plan)], [Assignment("r1", "A", 0, 1000)], segments, {}, [], MONTH)
    )
    invoice = build_invoice("inv", "c1", "USD", [rated], [], MONTH[1], Decimal("0"))
    assert [line.amount for line in invoice.lines] == [
        Decimal("0.28"),  # 1000 s: 0.2777...
        Decimal("-0.01"),
        Decimal("0.00"),
        Decimal("0.00"),
    ]
    assert invoice.total == Decimal("0.27")


def test_jpy_invoice_has_no_decimals() -> None:
    plan = PlanTerms(prices=(PricePoint("H100", 0, Decimal("100")),), currency="JPY")
    segments = {"A": [healthy("A", 0, 5418)]}  # 5418 s x 100 / 3600 = 150.5 -> 151
    rated = rate_rental(
        RatingInputs([rental(plan)], [Assignment("r1", "A", 0, 5418)], segments, {}, [], MONTH)
    )
    invoice = build_invoice("inv", "c1", "JPY", [rated], [], MONTH[1], Decimal("0.10"))
    assert [str(line.amount) for line in invoice.lines] == ["151", "15"]  # tax 15.1 -> 15
    assert str(invoice.total) == "166"


def test_adjustments_follow_rental_lines_and_count_towards_vouchers_and_tax() -> None:
    adjustment = InvoiceLine(
        LineKind.ADJUSTMENT, Decimal("-1.25"), "USD", rental_id="r1", adjusts_period="2026-10"
    )
    vouchers = open_vouchers([issue_voucher("v1", "c1", Decimal("2000"), 0, 90, "manual", "x")])
    invoice = build_invoice(
        "inv", "c1", "USD", [_month_on_a()], vouchers, MONTH[1], Decimal("0.19"), [adjustment]
    )
    assert [(line.kind, line.amount) for line in invoice.lines] == [
        (LineKind.CHARGE, Decimal("1792.80")),
        (LineKind.FAILURE_CREDIT, Decimal("-0.01")),
        (LineKind.ADJUSTMENT, Decimal("-1.25")),
        (LineKind.VOUCHER, Decimal("-1791.54")),  # never below zero, adjustment included
        (LineKind.TAX, Decimal("0.00")),
    ]


def test_the_xid_of_a_credit_comes_from_the_event_its_evidence_or_its_rule() -> None:
    assert xid_of({"event_id": "e1", "rule": "xid", "code": 79}) == 79
    classifier = {
        "rule": "xid_79_fallen_off_bus",
        "code": None,
        "detail": {"from": "healthy", "evidence": [{"rule": "x", "xid": 48}]},
    }
    assert xid_of(classifier) == 48  # the classifier's own evidence first
    assert xid_of({"rule": "xid_94_contained_ecc", "code": None}) == 94
    assert xid_of({"rule": "gpu_lost"}) is None
    # In NVIDIA's words, never a rule name: the driver's message, else the description the
    # evidence carries (the agent's XID catalog), else NVIDIA's name for the XID.
    assert evidence_text(classifier) == "XID 48: Double Bit ECC Error"
    assert evidence_text({"rule": "xid_79_fallen_off_bus", "code": 79}) == (
        "XID 79: GPU has fallen off the bus"
    )
    described = {"rule": "xid", "code": 154, "detail": {"description": "GPU recovery action"}}
    assert evidence_text(described) == "XID 154: GPU recovery action"
    item = {"rule": "xid", "code": 999, "detail": {"evidence": [{"description": "New code"}]}}
    assert evidence_text(item) == "XID 999: New code"
    assert evidence_text({"rule": "nvlink_down", "code": None}) == "nvlink down"
    assert evidence_text({"from_gpu": "A", "to_gpu": "B", "reason": None}) == "migrated from A to B"
