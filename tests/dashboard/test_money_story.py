"""The money story a customer can follow: one invoice document in the API's HTML, on the
dashboard and in the PDF; the path from usage to the amount due (the API's numbers on every
money page); exports of a month without an invoice; revenue with the prepaid balance."""

from __future__ import annotations

import csv
import html
import io
import re
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pypdf import PdfReader

from app.settings import get_settings
from tests.dashboard.world import PERIOD, World
from tests.harness import Console, bearer


@pytest.fixture
def seller(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("GPUMETER_SELLER_NAME", "Example GPU Cloud GmbH")
    monkeypatch.setenv("GPUMETER_SELLER_ADDRESS", "Hauptstr. 1\n10115 Berlin")
    monkeypatch.setenv("GPUMETER_SELLER_TAX_ID", "DE123456789")
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


def document_text(page: str) -> str:
    """The invoice document's text (tags dropped, entities read), without whitespace."""
    match = re.search(r'<article class="invoice-doc">.*?</article>', page, re.S)
    assert match, "no invoice document on the page"
    return squeeze(html.unescape(re.sub(r"<[^>]+>", " ", match.group(0))))


def squeeze(text: str) -> str:
    return re.sub(r"\s+", "", text)


def pdf_text(content: bytes) -> str:
    return "\n".join(p.extract_text() for p in PdfReader(io.BytesIO(content)).pages)


def euros(amount: str) -> str:
    value = Decimal(amount)
    return f"{'-' if value < 0 else ''}€{abs(value):,.2f}"


def test_one_invoice_document_in_the_api_html_the_dashboard_and_the_pdf(
    client: TestClient, seeded: World, seller: None
) -> None:
    inv, headers = seeded.invoice, bearer(seeded.acme.key)
    api = client.get(f"/v1/invoices/{inv['id']}/html", headers=headers).text
    page = client.get(f"/dashboard/invoices/{inv['id']}", headers=headers).text
    pdf = client.get(f"/dashboard/invoices/{inv['id']}/pdf", headers=headers).content
    text = pdf_text(pdf)
    (Path(__file__).parents[2] / "test-artifacts").mkdir(exist_ok=True)
    (Path(__file__).parents[2] / "test-artifacts" / "invoice-document.pdf").write_bytes(pdf)
    assert document_text(api) == document_text(page) == squeeze(text)
    # It is an invoice: seller, bill to, dates, lines with evidence, the path to the amount due.
    for fact in (
        "Example GPU Cloud GmbH",
        "Hauptstr. 1",
        "10115 Berlin",
        "Tax id: DE123456789",
        "Bill to",
        "Acme",
        "ops@acme.example.com",
        f"Invoice {inv['number']}",
        "Period 2026-10: 2026-10-01 to 2026-10-31 (Europe/Berlin)",
        "Due 20",
        "XID 79: GPU has fallen off the bus",
        "Tax 19 %",
        "Prepaid balance applied",
        f"Amount due {euros(inv['amount_due'])}",
    ):
        assert fact in text, fact
    assert text.index("Subtotal") < text.index("Tax 19 %") < text.index("Amount due")
    # Its lines call the rental what the pages call it (unnamed: what it rents and when, in
    # the invoice's zone), never by a fragment of its id.
    rental = "rental 1 \u00d7 H100, 2026-10-10 02:00 to 2026-10-12 02:00 CEST"
    assert squeeze(rental) in squeeze(text)
    assert seeded.acme.rental["id"][:8] not in text


def test_the_path_to_the_amount_due_adds_up_to_the_invoice(
    client: TestClient, seeded: World
) -> None:
    """Acme's October: €117.55 invoiced; its 5 % long-rental tier voucher was issued when the
    invoice was finalized, so it shows as usable and applies $0 here, with that reason."""
    inv, headers = seeded.invoice, bearer(seeded.acme.key)
    acme = seeded.acme.customer["id"]
    due = client.get(f"/v1/customers/{acme}/amount-due?period={PERIOD}", headers=headers).json()
    assert due == client.get(f"/v1/invoices/{inv['id']}/amount-due", headers=headers).json()
    steps = {s["key"]: Decimal(s["amount"]) for s in due["steps"]}
    assert [s["key"] for s in due["steps"]] == [
        "usage",
        "cap",
        "vouchers",
        "subtotal",
        "tax",
        "total",
        "prepaid",
        "amount_due",
    ]
    assert (due["source"], due["invoice_number"]) == ("invoice", inv["number"])
    assert steps["subtotal"] == Decimal(inv["subtotal"]) == steps["usage"] + steps["cap"]
    assert steps["tax"] == Decimal(inv["tax"])
    assert steps["amount_due"] == Decimal(inv["amount_due"]) == Decimal(due["amount_due"])
    assert steps["total"] == Decimal(inv["total"])
    assert steps["total"] + steps["prepaid"] == steps["amount_due"]
    usage = client.get(f"/v1/customers/{acme}/usage?period={PERIOD}", headers=headers).json()
    assert steps["usage"] + steps["cap"] == Decimal(usage["cost_to_date"])
    vouchers = due["vouchers"]
    assert vouchers["applied"] == "0.00" and vouchers["usable"] == usage["vouchers"]["usable"]
    assert Decimal(vouchers["usable"]) > 0
    assert "issued when it was finalized" in vouchers["reason"]
    assert "next invoice" in vouchers["reason"]
    # Each money page shows the API's steps.
    for path in (f"/dashboard?period={PERIOD}", f"/dashboard/costs?period={PERIOD}"):
        page = client.get(path, headers=headers).text
        for step in due["steps"]:
            shown = f'data-api="due.steps.{step["key"]}" data-raw="{step["amount"]}"'
            assert shown in page, (path, step)
        assert html.escape(vouchers["reason"]) in page, path
    invoice_page = client.get(f"/dashboard/invoices/{inv['id']}", headers=headers).text
    assert html.escape(vouchers["reason"]) in invoice_page


def test_a_month_without_an_invoice_previews_it_and_exports_to_date(
    client: TestClient, console: Console, seeded: World
) -> None:
    """Other's October has no invoice: the path is the month rated as an invoice finalized now
    would be (its €10 prepaid balance taken after tax), and the exports are of that month to
    date, summing to its cost."""
    other = seeded.other.customer["id"]
    headers = bearer(seeded.other.key)
    console.post(f"/v1/customers/{other}/balance/top-ups", {"amount": "10.00", "reason": "t"})
    due = client.get(f"/v1/customers/{other}/amount-due?period={PERIOD}", headers=headers).json()
    assert (due["source"], due["invoice_id"]) == ("to_date", None)
    steps = {s["key"]: Decimal(s["amount"]) for s in due["steps"]}
    usage = client.get(f"/v1/customers/{other}/usage?period={PERIOD}", headers=headers).json()
    cost = Decimal(usage["cost_to_date"])
    # 48 h at 2.49 = 119.52, less the tier voucher nobody has: no vouchers; 19 % tax.
    assert steps["usage"] + steps["cap"] == cost == Decimal("119.52")
    assert steps["tax"] == Decimal("22.71") and steps["prepaid"] == Decimal("-10.00")
    assert steps["amount_due"] == cost + steps["tax"] - 10
    assert due["vouchers"]["reason"].startswith("No vouchers to apply")
    for kind, amount_column in (("usage.csv", "amount"), ("focus.csv", "BilledCost")):
        path = f"/dashboard/exports/{kind}?period={PERIOD}"
        response = client.get(path, headers=headers)
        assert response.status_code == 200, response.text
        assert "attachment" in response.headers["content-disposition"]
        rows = list(csv.DictReader(io.StringIO(response.text)))
        assert sum(Decimal(r[amount_column]) for r in rows) == cost
    page = client.get(f"/dashboard?period={PERIOD}", headers=headers).text
    assert f"Export {PERIOD} to date" in page


def test_a_future_month_export_says_why_in_words(client: TestClient, seeded: World) -> None:
    response = client.get(
        "/dashboard/exports/usage.csv?period=2099-01", headers=bearer(seeded.acme.key)
    )
    assert response.status_code == 422 and response.headers["content-type"].startswith("text/html")
    assert "period 2099-01 has not started yet" in response.text
    assert "/v1/" not in response.text  # no admin route for a customer to call


def test_revenue_totals_include_the_prepaid_balance(
    client: TestClient, console: Console, seeded: World
) -> None:
    """Other's October drafted with €10 of prepaid balance: the month's total is what was
    invoiced, the prepaid column what balances paid, amount due the invoices' amounts due."""
    other = seeded.other.customer["id"]
    console.post(f"/v1/customers/{other}/balance/top-ups", {"amount": "10.00", "reason": "t"})
    run = {"period": PERIOD, "customer_id": other}
    invoice_id = console.post("/v1/invoices/runs", run, status=200)["invoice_ids"][0]
    drafted = client.get(f"/v1/invoices/{invoice_id}", headers=console.headers).json()
    months = client.get(f"/v1/revenue?first={PERIOD}&last={PERIOD}", headers=console.headers)
    (month,) = months.json()["months"]
    assert month["prepaid"] == "-10.00"
    invoices = (seeded.invoice, drafted)
    # The month's total and amount due are its invoices' (each named as on the invoice).
    assert Decimal(month["total"]) == sum(Decimal(i["total"]) for i in invoices)
    assert Decimal(month["amount_due"]) == sum(Decimal(i["amount_due"]) for i in invoices)
    assert Decimal(month["total"]) + Decimal(month["prepaid"]) == Decimal(month["amount_due"])
    page = client.get("/dashboard/revenue", headers=console.headers).text
    assert f'data-api="amount_due" data-raw="{month["amount_due"]}"' in page
    assert 'data-api="prepaid" data-raw="-10.00"' in page
    # Per customer: each one's invoices, to the cent, adding up to the month.
    by_customer = {c["customer_name"]: c for c in month["customers"]}
    assert set(by_customer) == {"Acme", "Other"}
    assert by_customer["Acme"]["amount_due"] == seeded.invoice["amount_due"]
    assert by_customer["Other"]["amount_due"] == drafted["amount_due"]
    assert (by_customer["Other"]["prepaid"], by_customer["Acme"]["prepaid"]) == ("-10.00", "0.00")
    for key in ("billed", "credited", "tax", "total", "prepaid", "amount_due"):
        assert sum(Decimal(c[key]) for c in month["customers"]) == Decimal(month[key]), key
    assert sum(c["invoices"] for c in month["customers"]) == month["invoices"] == 2
    for c in month["customers"]:
        row = page[page.index(f'data-customer="{c["customer_id"]}"') :]
        assert f'data-api="amount_due" data-raw="{c["amount_due"]}"' in row.split("</tr>")[0]
