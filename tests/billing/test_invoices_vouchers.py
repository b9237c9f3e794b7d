"""The voucher ledger through two periods: tier issue, manual grants, expiry, partial use."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from sqlalchemy import Engine

from tests.billing.world import get, october_with_failure, run_invoice
from tests.harness import Console


def _ledger(console: Console, customer_id: str) -> tuple[list[tuple[str, str, str]], str]:
    ledger = get(console, f"/v1/customers/{customer_id}/vouchers")
    entries = [(e["kind"], e["amount"], e["voucher_id"].split(":")[0]) for e in ledger["entries"]]
    issued = sum(Decimal(e["amount"]) for e in ledger["entries"] if e["kind"] == "issued")
    used = sum(Decimal(e["amount"]) for e in ledger["entries"] if e["kind"] != "issued")
    assert Decimal(ledger["balance"]) == issued - used  # conserved, always
    return sorted(entries), ledger["balance"]


def test_vouchers_over_october_and_november(console: Console, db: Engine, now: datetime) -> None:
    world = october_with_failure(console, db)
    customer = world.customer["id"]
    october = run_invoice(console, "2026-10")
    console.post(f"/v1/invoices/{october['id']}/finalize", {}, 200)  # tier: 277.59, 90 days
    grants = f"/v1/customers/{customer}/vouchers"
    console.post(grants, {"amount": "50.00", "validity_days": 1, "reason": "goodwill"})
    console.post(grants, {"amount": "1500.00", "validity_days": 30, "reason": "outage SLA"})

    november = run_invoice(console, "2026-11")
    # 29 days of telemetry (Nov 30 unmetered): 2,505,600 s x 2.49/h = 1733.04. The 1-day
    # voucher expired before the invoice date; the 30-day one goes first (oldest expiry),
    # then the tier voucher covers what is left, partly; nothing goes below zero.
    assert [(x["kind"], x["amount"]) for x in november["lines"]] == [
        ("charge", "1733.04"),
        ("voucher", "-1500.00"),
        ("voucher", "-233.04"),
        ("tax", "0.00"),
    ]
    assert november["total"] == "0.00"
    expected = [
        ("applied", "1500.00", "manual"),
        ("applied", "233.04", "tier"),
        ("expired", "50.00", "manual"),
        ("issued", "1500.00", "manual"),
        ("issued", "277.59", "tier"),
        ("issued", "50.00", "manual"),
    ]
    assert _ledger(console, customer) == (expected, "44.55")
    # Running again replaces the draft's provisional entries instead of adding to them.
    assert run_invoice(console, "2026-11")["lines"] == november["lines"]
    assert _ledger(console, customer) == (expected, "44.55")

    console.post(f"/v1/invoices/{november['id']}/finalize", {"force": True}, 200)
    # Rental of 61 days at November's end: 15 % of 1733.04 = 259.956 -> 259.96.
    assert _ledger(console, customer)[1] == "304.51"

    console.post(f"/v1/invoices/{november['id']}/void", {"reason": "duplicate"}, 200)
    entries, balance = _ledger(console, customer)
    assert balance == "2037.55"  # what November consumed comes back, as new vouchers
    assert [e for e in entries if e[2] == "reissue"] == [
        ("issued", "1500.00", "reissue"),
        ("issued", "233.04", "reissue"),
    ]
