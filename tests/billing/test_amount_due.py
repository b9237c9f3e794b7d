"""The path from usage to the amount due: steps that add up, and why vouchers did or did not
apply to a draft, to the invoice that finalizes it, and to the month to date."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any

from fastapi import FastAPI
from sqlalchemy import Engine

from app.billing.amount_due import Chain
from app.billing.endpoints import clock
from tests.billing.world import october_with_failure, run_invoice
from tests.harness import Console


def steps(due: dict[str, Any]) -> dict[str, str]:
    return {s["key"]: s["amount"] for s in due["steps"]}


def test_each_step_sums_its_lines_and_corrections_show_only_when_there_are_some() -> None:
    lines = [
        ("charge", Decimal("100.00")),
        ("failure_credit", Decimal("-2.50")),
        ("cap", Decimal("-7.50")),
        ("voucher", Decimal("-10.00")),
        ("tax", Decimal("15.20")),
        ("prepaid_balance", Decimal("-5.00")),
    ]
    chain = Chain.of(lines, Decimal("0.19"))
    shown = {s.key: (s.label, s.amount) for s in chain.steps("EUR")}
    assert shown == {
        "usage": ("Usage (GPU time less credits)", "97.50"),
        "cap": ("Monthly cap", "-7.50"),
        "vouchers": ("Vouchers", "-10.00"),
        "subtotal": ("Subtotal", "80.00"),
        "tax": ("Tax 19 %", "15.20"),
        "total": ("Total", "95.20"),
        "prepaid": ("Prepaid balance applied", "-5.00"),
        "amount_due": ("Amount due", "90.20"),
    }
    corrected = Chain.of([*lines, ("adjustment", Decimal("-1.00"))], Decimal("0.19"))
    assert [s.key for s in corrected.steps("EUR")][2] == "corrections"
    assert corrected.amounts["subtotal"] == Decimal("79.00")


def test_a_voucher_granted_after_the_draft_applies_at_finalization(
    console: Console, db: Engine, app: FastAPI, now: datetime
) -> None:
    """October's draft was computed before the €100 voucher existed: it applies nothing and
    says so; finalizing (which rebuilds the draft) applies it, oldest expiry first."""
    october_with_failure(console, db)
    draft = run_invoice(console, "2026-10")
    customer = draft["customer_id"]
    grant = {"amount": "100.00", "reason": "goodwill", "validity_days": 90}
    console.post(f"/v1/customers/{customer}/vouchers", grant)
    later = datetime(2026, 11, 5, 12, 5, tzinfo=now.tzinfo)
    app.dependency_overrides[clock] = lambda: later
    before = console.client.get(
        f"/v1/invoices/{draft['id']}/amount-due", headers=console.headers
    ).json()
    assert (before["status"], before["vouchers"]["applied"]) == ("draft", "0.00")
    assert before["vouchers"]["usable"] == "100.00"
    assert before["vouchers"]["reason"] == (
        "This draft was computed on 2026-11-05 12:00 UTC, before your $100.00 of vouchers "
        "were usable: finalization applies them."
    )
    final = console.post(f"/v1/invoices/{draft['id']}/finalize", {}, 200)
    after = console.client.get(
        f"/v1/invoices/{draft['id']}/amount-due", headers=console.headers
    ).json()
    assert after["vouchers"]["applied"] == "100.00"
    assert after["vouchers"]["reason"].startswith("$100.00 of vouchers applied at finalization")
    assert steps(after)["vouchers"] == "-100.00"
    assert steps(after)["amount_due"] == final["total"]
    # 1850.59 after credits, less 100 = 1750.59; 19 % tax 332.61.
    assert (steps(after)["subtotal"], steps(after)["tax"]) == ("1750.59", "332.61")
