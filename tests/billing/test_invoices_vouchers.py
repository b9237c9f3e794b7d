"""The voucher ledger through two periods: tier issue, manual grants, expiry, partial use."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

from fastapi import FastAPI
from sqlalchemy import Engine

from app.billing.endpoints import clock
from tests.billing.world import get, october_with_failure, run_invoice
from tests.harness import Console


def _ledger(console: Console, customer_id: str) -> tuple[list[tuple[str, str, str]], str]:
    ledger = get(console, f"/v1/customers/{customer_id}/vouchers")
    entries = [(e["kind"], e["amount"], e["voucher_id"].split(":")[0]) for e in ledger["entries"]]
    issued = sum(Decimal(e["amount"]) for e in ledger["entries"] if e["kind"] == "issued")
    used = sum(Decimal(e["amount"]) for e in ledger["entries"] if e["kind"] != "issued")
    assert Decimal(ledger["balance"]) == issued - used  # conserved, always
    return sorted(entries), ledger["balance"]


def test_vouchers_over_october_and_november(
    console: Console, db: Engine, app: FastAPI, now: datetime
) -> None:
    world = october_with_failure(console, db)
    customer = world.customer["id"]
    october = run_invoice(console, "2026-10")
    console.post(f"/v1/invoices/{october['id']}/finalize", {}, 200)  # tier: 277.59, 90 days
    grants = f"/v1/customers/{customer}/vouchers"
    console.post(grants, {"amount": "50.00", "validity_days": 1, "reason": "goodwill"})
    console.post(grants, {"amount": "1500.00", "validity_days": 30, "reason": "outage SLA"})

    november = run_invoice(console, "2026-11")
    # 29 days of telemetry (Nov 30 unmetered): 2,505,600 s x 2.49/h = 1733.04. Drafted now
    # (5 Nov), every voucher is valid: oldest expiry first (the 1-day one, the 30-day one),
    # then the tier voucher for what is left; the draft writes no ledger entries.
    assert [(x["kind"], x["amount"]) for x in november["lines"]] == [
        ("charge", "1733.04"),
        ("voucher", "-50.00"),
        ("voucher", "-1500.00"),
        ("voucher", "-183.04"),
        ("tax", "0.00"),
    ]
    issued = [
        ("issued", "1500.00", "manual"),
        ("issued", "277.59", "tier"),
        ("issued", "50.00", "manual"),
    ]
    assert _ledger(console, customer) == (issued, "1827.59")
    assert run_invoice(console, "2026-11")["lines"] == november["lines"]  # idempotent
    assert _ledger(console, customer) == (issued, "1827.59")

    # Finalized on 1 Dec 07:00: the 1-day voucher expired on 6 Nov 12:00 and is written off,
    # dated at its expiry; the others apply as they are valid at finalization.
    later = datetime(2026, 12, 1, 7, 0, tzinfo=UTC)
    app.dependency_overrides[clock] = lambda: later
    final = console.post(f"/v1/invoices/{november['id']}/finalize", {}, 200)
    assert [(x["kind"], x["amount"]) for x in final["lines"]][1:3] == [
        ("voucher", "-1500.00"),
        ("voucher", "-233.04"),
    ]
    ledger = get(console, f"/v1/customers/{customer}/vouchers")
    expired = [(e["at"], e["amount"]) for e in ledger["entries"] if e["kind"] == "expired"]
    assert expired == [("2026-11-06T12:00:00Z", "50.00")]
    applied = {e["at"] for e in ledger["entries"] if e["kind"] == "applied"}
    assert applied == {"2026-12-01T07:00:00Z"}
    # Rental of 61 days at November's end: 15 % of 1733.04 = 259.956 -> 259.96.
    assert _ledger(console, customer)[1] == "304.51"

    console.post(f"/v1/invoices/{november['id']}/void", {"reason": "duplicate"}, 200)
    entries, balance = _ledger(console, customer)
    # What November consumed comes back, as new vouchers; the 259.96 it earned (unspent) is
    # taken back: 304.51 + 1500.00 + 233.04 - 259.96.
    assert balance == "1777.59"
    assert [e for e in entries if e[2] == "reissue"] == [
        ("issued", "1500.00", "reissue"),
        ("issued", "233.04", "reissue"),
    ]
    assert [e for e in entries if e[0] == "revoked"] == [("revoked", "259.96", "tier")]


def test_a_voucher_granted_after_the_period_reaches_its_invoice(
    console: Console, db: Engine, now: datetime
) -> None:
    """A goodwill voucher granted after October ended applies to October's invoice finalized
    after the grant (today it reached only periods ending after it was issued)."""
    world = october_with_failure(console, db)
    grants = f"/v1/customers/{world.customer['id']}/vouchers"
    console.post(grants, {"amount": "10.00", "validity_days": 1, "reason": "goodwill"})
    october = run_invoice(console, "2026-10")
    final = console.post(f"/v1/invoices/{october['id']}/finalize", {}, 200)
    assert [(x["kind"], x["amount"]) for x in final["lines"] if x["kind"] == "voucher"] == [
        ("voucher", "-10.00")
    ]
