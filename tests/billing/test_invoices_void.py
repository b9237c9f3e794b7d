"""Voiding and running the period again: the replacement never applies the voided invoice's
own voucher to itself; voiding takes back what the invoice earned and nobody spent, and the
replacement earns it again at finalization, less what was spent."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Engine

from tests.billing.world import get, october_with_failure
from tests.harness import Console

OCTOBER = "2026-10"


def _finalize(console: Console, period: str, **body: Any) -> dict[str, Any]:
    """Run ``period`` with finalization and read back its one live invoice."""
    run = console.post("/v1/invoices/runs", {"period": period, "finalize": True, **body}, 200)
    assert run["failures"] == []
    [invoice_id] = run["invoice_ids"]
    return get(console, f"/v1/invoices/{invoice_id}")


def _vouchers(console: Console, customer_id: str) -> list[tuple[str, str, str]]:
    ledger = get(console, f"/v1/customers/{customer_id}/vouchers")
    return [(e["kind"], e["amount"], e["voucher_id"]) for e in ledger["entries"]]


def _void(console: Console, invoice: dict[str, Any]) -> None:
    console.post(f"/v1/invoices/{invoice['id']}/void", {"reason": "wrong address"}, 200)


def test_void_then_rerun_keeps_the_amount_due_to_the_cent(
    console: Console, db: Engine, now: datetime
) -> None:
    """The demo's case: a long rental earns a voucher at finalization; voided and run again,
    its replacement is due exactly what it was (it used the voucher on itself before)."""
    customer = october_with_failure(console, db).customer["id"]
    first = _finalize(console, OCTOBER)
    assert (first["total"], first["amount_due"]) == ("2202.20", "2202.20")
    [(_, earned, tier_id)] = _vouchers(console, customer)
    assert earned == "277.59"  # 15 % of 1850.59 for a 31-day rental

    _void(console, first)
    replacement = _finalize(console, OCTOBER)
    assert replacement["id"] != first["id"]
    assert (replacement["total"], replacement["amount_due"]) == ("2202.20", "2202.20")
    assert [line["kind"] for line in replacement["lines"]] == [
        "charge",
        "failure_credit",
        "migration_credit",
        "tax",
    ]
    # Taken back at the void, earned again by the replacement: held once, never spent on itself.
    assert _vouchers(console, customer) == [
        ("issued", "277.59", tier_id),
        ("revoked", "277.59", tier_id),
        ("issued", "277.59", f"{tier_id}:{replacement['id']}"),
    ]
    ledger = get(console, f"/v1/customers/{customer}/vouchers")
    assert (ledger["balance"], ledger["usable"]) == ("277.59", "277.59")
    due = get(console, f"/v1/invoices/{first['id']}/amount-due")
    assert "what was left of those it earned was taken back" in due["vouchers"]["reason"]


def test_a_voucher_partly_spent_before_the_void_is_earned_again_less_what_was_spent(
    console: Console, db: Engine, now: datetime
) -> None:
    """October earns 277.59; November (one day, 59.76) spends 59.76 of it. Voiding October
    takes back the 217.83 left; the replacement earns 277.59 less the 59.76 spent: October's
    rental is rewarded 277.59 in all, never twice."""
    world = october_with_failure(console, db)
    customer, rental = world.customer["id"], world.rental["id"]
    console.post(f"/v1/rentals/{rental}/end", {"end_at": "2026-11-02T00:00:00Z"}, 200)
    october = _finalize(console, OCTOBER)
    [(_, _, tier_id)] = _vouchers(console, customer)
    november = _finalize(console, "2026-11", force=True)
    # 86,400 s x 2.49/h = 59.76, all of it paid by October's voucher.
    assert [(x["kind"], x["amount"]) for x in november["lines"]] == [
        ("charge", "59.76"),
        ("voucher", "-59.76"),
        ("tax", "0.00"),
    ]
    _void(console, october)
    replacement = _finalize(console, OCTOBER)
    # November's own tier voucher (15 % of 59.76 = 8.96) applies to it, as to any invoice.
    assert [(x["kind"], x["amount"]) for x in replacement["lines"]][3:] == [
        ("voucher", "-8.96"),
        ("tax", "349.91"),  # 19 % of 1841.63 = 349.9097
    ]
    assert (replacement["total"], replacement["amount_due"]) == ("2191.54", "2191.54")
    entries = _vouchers(console, customer)
    assert [e for e in entries if e[2].startswith(tier_id)] == [
        ("issued", "277.59", tier_id),
        ("applied", "59.76", tier_id),  # on November, which stays
        ("revoked", "217.83", tier_id),
        ("issued", "217.83", f"{tier_id}:{replacement['id']}"),
    ]
    assert get(console, f"/v1/customers/{customer}/vouchers")["balance"] == "217.83"
