"""Prepaid balance: trial credit once, top-ups, applied at finalization after vouchers and tax,
returned on void, never below zero, balance.low when it falls below the threshold."""

from __future__ import annotations

import html
import io
import re
import uuid
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest
from pypdf import PdfReader
from sqlalchemy import Engine

from app.balances import service
from app.billing import service as billing_service
from app.billing.html import Seller, invoice_document
from app.billing.schemas import InvoiceRead
from app.cli.common import OPERATOR
from app.core.db import transaction
from app.core.errors import Conflict
from app.customers.models import Customer
from app.dashboard.pdf import render as render_pdf
from app.settings import get_settings
from tests.billing.world import get, write_telemetry
from tests.harness import Console, Ran, bearer

pytestmark = pytest.mark.usefixtures("trial")


def balance(console: Console, customer_id: str) -> dict[str, Any]:
    return get(console, f"/v1/customers/{customer_id}/balance")


def entries(console: Console, customer_id: str) -> list[dict[str, Any]]:
    return get(console, f"/v1/customers/{customer_id}/balance/entries")["items"]


def test_signup_credit_is_granted_once(console: Console, db: Engine) -> None:
    acme = console.customer("Acme")
    assert balance(console, acme["id"]) == {
        "customer_id": acme["id"],
        "currency": "USD",
        "balance": "10.00",
        "low_threshold": "2.00",
        "low": False,
    }
    with transaction(db) as session:  # a second grant (a retried hook, say) adds nothing
        customer = session.get_one(Customer, acme["id"])
        service.grant_trial_credit(session, customer, get_settings().trial_credit)
    [trial] = entries(console, acme["id"])
    assert (trial["kind"], trial["amount"], trial["balance"]) == ("trial", "10.00", "10.00")


def test_admin_tops_up_a_customer_only_reads(console: Console) -> None:
    acme = console.customer("Acme")
    path = f"/v1/customers/{acme['id']}/balance/top-ups"
    entry = console.post(path, {"amount": "25.50", "reason": "bank transfer 2026-11-02"})
    assert (entry["kind"], entry["amount"], entry["balance"]) == ("top_up", "25.50", "35.50")
    key = console.post(f"/v1/customers/{acme['id']}/keys", {"name": "acme"})["key"]
    refused = console.client.post(path, json={"amount": "1", "reason": "x"}, headers=bearer(key))
    assert refused.status_code == 403
    own = console.client.get(f"/v1/customers/{acme['id']}/balance", headers=bearer(key))
    assert own.json()["balance"] == "35.50"
    too_fine = console.client.post(
        path, json={"amount": "0.001", "reason": "x"}, headers=console.headers
    )
    assert too_fine.status_code == 422
    assert too_fine.json()["detail"][0]["loc"] == ["body", "amount"]
    assert "0.001 is not a whole amount of USD" in too_fine.json()["detail"][0]["msg"]


def october(console: Console, db: Engine, hours: int) -> dict[str, Any]:
    """Acme (19 % tax) rents one H100 at 2.00/h for ``hours`` hours of 1 Oct 2026."""
    acme = console.customer("Acme", tax_rate="0.19")
    plan = console.plan("on-demand", price="2.00")
    node = console.node()["node"]
    console.gpu(node["id"], "GPU-A")
    end = f"2026-10-01T{hours:02d}:00:00Z"
    rental = console.rental(acme["id"], plan["id"], start_at="2026-10-01T00:00:00Z", end_at=end)
    console.assign(rental["id"], "GPU-A", "2026-10-01T00:00:00Z", end_at=end)
    write_telemetry(db, "GPU-A", [("2026-10-01T00:00:00", end[:-1], "healthy")])
    return acme


def finalize_october(console: Console) -> dict[str, Any]:
    body = {"period": "2026-10", "finalize": True}
    [invoice_id] = console.post("/v1/invoices/runs", body, 200)["invoice_ids"]
    return get(console, f"/v1/invoices/{invoice_id}")


def kinds(invoice: dict[str, Any]) -> list[tuple[str, str]]:
    return [(line["kind"], line["amount"]) for line in invoice["lines"]]


def test_balance_pays_after_vouchers_and_tax_once(console: Console, db: Engine) -> None:
    acme = october(console, db, hours=3)  # 6.00 + 19 % tax = 7.14, all paid from the 10.00
    console.post(
        f"/v1/customers/{acme['id']}/vouchers",
        {"amount": "1.00", "reason": "goodwill", "validity_days": 3650},
    )
    invoice = finalize_october(console)
    assert kinds(invoice) == [
        ("charge", "6.00"),
        ("voucher", "-1.00"),
        ("tax", "0.95"),  # 19 % of 5.00: the voucher lowered the taxable amount, the balance not
        ("prepaid_balance", "-5.95"),
    ]
    totals = ("subtotal", "tax", "total", "amount_due")
    assert tuple(invoice[k] for k in totals) == ("5.00", "0.95", "5.95", "0.00")
    assert balance(console, acme["id"])["balance"] == "4.05"
    again = finalize_october(console)  # the run again: finalized invoices are never touched
    assert again["amount_due"] == "0.00"
    assert [e["kind"] for e in entries(console, acme["id"])] == ["applied", "trial"]
    assert balance(console, acme["id"])["balance"] == "4.05"


def test_balance_smaller_than_the_invoice_pays_part_and_reaches_zero(
    console: Console, db: Engine
) -> None:
    acme = october(console, db, hours=10)  # 20.00 + 3.80 tax = 23.80; 10.00 paid in advance
    invoice = finalize_october(console)
    assert kinds(invoice)[-2:] == [("tax", "3.80"), ("prepaid_balance", "-10.00")]
    assert (invoice["total"], invoice["amount_due"]) == ("23.80", "13.80")
    assert balance(console, acme["id"])["balance"] == "0.00"
    [low] = [e for e in events(console) if e["type"] == "balance.low"]
    assert low["customer_id"] == acme["id"]
    assert low["data"] == {
        "customer_id": acme["id"],
        "currency": "USD",
        "balance": "0.00",
        "threshold": "2.00",
    }


def test_void_returns_the_balance_and_the_new_invoice_takes_it_again(
    console: Console, db: Engine
) -> None:
    acme = october(console, db, hours=3)
    invoice = finalize_october(console)
    console.post(f"/v1/invoices/{invoice['id']}/void", {"reason": "wrong address"}, 200)
    assert balance(console, acme["id"])["balance"] == "10.00"
    again = finalize_october(console)
    assert again["id"] != invoice["id"]
    assert kinds(again)[-1] == ("prepaid_balance", "-7.14")
    assert balance(console, acme["id"])["balance"] == "2.86"
    amounts = [(e["kind"], e["amount"], e["balance"]) for e in entries(console, acme["id"])]
    assert amounts == [
        ("applied", "-7.14", "2.86"),
        ("returned", "7.14", "10.00"),
        ("applied", "-7.14", "2.86"),
        ("trial", "10.00", "10.00"),
    ]


def events(console: Console) -> list[dict[str, Any]]:
    return get(console, "/v1/events?limit=1000")["items"]


def test_the_balance_never_goes_below_zero(console: Console, db: Engine) -> None:
    acme = console.customer("Acme")
    with transaction(db) as session:
        customer = session.get_one(Customer, acme["id"])
        with pytest.raises(
            Conflict, match=re.escape("the balance is 10.00 USD: 10.01 cannot be taken")
        ):
            low = get_settings().balance_low_threshold
            service.apply_to_invoice(session, customer, uuid.uuid4(), "GM-1", Decimal("10.01"), low)
    assert balance(console, acme["id"])["balance"] == "10.00"


def test_the_dashboard_shows_the_balance_the_api_has(console: Console, db: Engine) -> None:
    acme = october(console, db, hours=10)
    finalize_october(console)  # takes all 10.00: the balance is low
    key = console.post(f"/v1/customers/{acme['id']}/keys", {"name": "acme"})["key"]
    api = console.client.get(f"/v1/customers/{acme['id']}/balance", headers=bearer(key)).json()
    html = console.client.get("/dashboard?period=2026-10", headers=bearer(key)).text
    assert re.search(r'data-api="balance"[^>]*data-raw="0.00"', html)
    assert (api["balance"], api["low"]) == ("0.00", True)
    assert "Prepaid balance" in html and "Low: below $2.00." in html


def test_amounts_and_the_balance_stay_within_a_bigint_of_cents(console: Console) -> None:
    acme = console.customer("Acme")
    path = f"/v1/customers/{acme['id']}/balance/top-ups"
    huge = console.client.post(
        path, json={"amount": "1e17", "reason": "x"}, headers=console.headers
    )  # was a 500
    assert huge.status_code == 422, huge.text
    [error] = huge.json()["detail"]
    assert (error["loc"], error["msg"]) == (
        ["body", "amount"],
        "Input should be less than or equal to 1000000000000000",
    )
    console.post(path, {"amount": "600000000000000", "reason": "first"})
    second = console.client.post(
        path, json={"amount": "600000000000000", "reason": "second"}, headers=console.headers
    )  # two of 5e16 overflowed the ledger, and every later credit was a 500
    assert second.status_code == 422, second.text
    assert second.json()["detail"][0]["msg"] == (
        "the balance is 600000000000010.00 USD: 600000000000000.00 more would take it past "
        "the largest a balance may hold, 1000000000000000"
    )
    entry = console.post(path, {"amount": "5.00", "reason": "still works"})
    assert entry["balance"] == "600000000000015.00"


def test_total_is_before_the_prepaid_balance_and_amount_due_after_it_everywhere(
    console: Console, db: Engine, gpumeter: Callable[..., Ran]
) -> None:
    """As Stripe names them: total = subtotal + tax; amount due = total less the prepaid
    balance. The API (list, invoice, amount-due), the CLI (list, show) and the invoice document
    (HTML and PDF) say the same two figures under the same two names."""
    october(console, db, hours=10)  # 20.00 + 3.80 tax = 23.80; 10.00 paid in advance
    invoice = finalize_october(console)
    figures = ("subtotal", "tax", "total", "amount_due")
    assert tuple(invoice[k] for k in figures) == ("20.00", "3.80", "23.80", "13.80")
    [listed] = get(console, "/v1/invoices")["items"]
    assert tuple(listed[k] for k in figures) == ("20.00", "3.80", "23.80", "13.80")
    due = get(console, f"/v1/invoices/{invoice['id']}/amount-due")
    steps = {step["key"]: step["amount"] for step in due["steps"]}
    assert (steps["total"], steps["prepaid"], steps["amount_due"]) == ("23.80", "-10.00", "13.80")
    assert due["amount_due"] == "13.80"

    rows = gpumeter("invoices", "list").out.splitlines()
    assert re.split(r"\s{2,}", rows[0])[5:7] == ["TOTAL", "AMOUNT DUE"]
    assert re.split(r"\s{2,}", rows[1])[5:7] == ["23.80 USD", "13.80 USD"]
    shown = gpumeter("invoices", "show", invoice["id"]).out.splitlines()
    assert "total       23.80 USD" in shown
    assert "amount due  13.80 USD (total less prepaid balance)" in shown

    with transaction(db) as session:
        row = billing_service.get_invoice(session, uuid.UUID(invoice["id"]), OPERATOR)
        customer = session.get_one(Customer, row.customer_id)
        names = billing_service.rental_names(session, row)
        document = invoice_document(InvoiceRead.of(row), customer, Seller.of(get_settings()), names)
    page = console.client.get(f"/v1/invoices/{invoice['id']}/html", headers=console.headers)
    pdf = "".join(p.extract_text() for p in PdfReader(io.BytesIO(render_pdf(document))).pages)
    for text in (html.unescape(re.sub(r"<[^>]+>", "", page.text)), pdf):
        flat = re.sub(r"\s+", "", text)
        assert "Total$23.80Prepaidbalanceapplied-$10.00Amountdue$13.80" in flat
