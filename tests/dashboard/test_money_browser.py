"""The money pages in real headless Chromium at 1440 and 390 px: the path from usage to the
amount due shows the API's numbers, nothing scrolls sideways, the invoice page shows the same
document as the API's HTML, and the open month's exports download. Screenshots go to
test-artifacts/money/."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest

from tests.dashboard.test_browser import SHOTS, browser, portal_path, server  # noqa: F401
from tests.dashboard.test_browser_widths import at_both_widths
from tests.dashboard.world import PERIOD, World
from tests.harness import Console

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("browser")]

from playwright.sync_api import Browser, BrowserContext, Page, expect  # noqa: E402

MONEY_SHOTS = SHOTS.parent / "money"


def euros(amount: str) -> str:
    value = Decimal(amount)
    return f"{'-' if value < 0 else ''}€{abs(value):,.2f}"


@pytest.fixture
def acme_context(
    server: str,  # noqa: F811
    browser: Browser,  # noqa: F811
    console: Console,
    seeded: World,
) -> Iterator[BrowserContext]:
    context = browser.new_context(base_url=server, accept_downloads=True)
    page = context.new_page()
    page.goto(portal_path(console, seeded.acme.customer["id"]))
    page.close()
    yield context
    context.close()


def chain_is_the_apis(page: Page, due: dict) -> None:
    for step in due["steps"]:
        cell = page.locator(f'[data-api="due.steps.{step["key"]}"]')
        expect(cell).to_have_attribute("data-raw", step["amount"])
        expect(cell).to_have_text(euros(step["amount"]))
    expect(page.locator(".why-vouchers")).to_contain_text(due["vouchers"]["reason"])


def test_money_pages_show_the_apis_path_to_the_amount_due(
    acme_context: BrowserContext, seeded: World
) -> None:
    page = acme_context.new_page()
    acme = seeded.acme.customer["id"]
    due = acme_context.request.get(f"/v1/customers/{acme}/amount-due?period={PERIOD}").json()
    for name, path in (
        ("overview", f"/dashboard?period={PERIOD}"),
        ("costs", f"/dashboard/costs?period={PERIOD}"),
    ):
        page.goto(path)
        chain_is_the_apis(page, due)
        at_both_widths(page, name, MONEY_SHOTS)

    page.goto(f"/dashboard/what-if?period={PERIOD}")
    what_if = acme_context.request.get(f"/v1/customers/{acme}/what-if?period={PERIOD}").json()
    credits = page.locator("td.credits")
    expect(credits).to_have_count(3)
    for cell, row in zip(credits.all(), what_if["rows"], strict=True):
        expect(cell).to_have_attribute("data-raw", row["credits"])
    expect(page.locator(".whatif-why")).to_contain_text("the cap holds that bill down too")
    at_both_widths(page, "what-if", MONEY_SHOTS)


def test_the_invoice_page_is_the_apis_document(acme_context: BrowserContext, seeded: World) -> None:
    inv = seeded.invoice
    page = acme_context.new_page()
    page.goto(f"/v1/invoices/{inv['id']}/html")
    api_text = page.locator("article.invoice-doc").inner_text()
    page.goto(f"/dashboard/invoices/{inv['id']}")
    doc = page.locator("article.invoice-doc")
    assert doc.inner_text() == api_text
    expect(doc).to_contain_text("Bill to")
    expect(doc.locator('[data-api="steps.amount_due"]')).to_have_text(euros(inv["amount_due"]))
    due = acme_context.request.get(f"/v1/invoices/{inv['id']}/amount-due").json()
    for step in due["steps"]:
        expect(doc.locator(f'[data-api="steps.{step["key"]}"]')).to_have_text(euros(step["amount"]))
    expect(page.locator(".why-vouchers")).to_contain_text(due["vouchers"]["reason"])
    at_both_widths(page, "invoice", MONEY_SHOTS)
    page.set_viewport_size({"width": 1440, "height": 900})
    with page.expect_download() as download:
        page.get_by_role("link", name="Download PDF").click()
    assert download.value.suggested_filename == f"invoice-{inv['number']}.pdf"


def test_the_open_months_exports_download(acme_context: BrowserContext) -> None:
    page = acme_context.new_page()
    page.goto("/dashboard")  # the current month: no invoice yet
    expect(page.locator(".exports")).to_contain_text("to date")
    for link, suffix in (("FOCUS 1.2 CSV", "focus.csv"), ("Usage and cost CSV", "usage.csv")):
        with page.expect_download() as download:
            page.get_by_role("link", name=link).click()
        assert download.value.suggested_filename.endswith(suffix)
        assert download.value.failure() is None
        header = Path(download.value.path()).read_text().splitlines()[0]
        assert header.startswith(("BilledCost,", "period,day,"))


def test_revenue_page_totals_include_the_prepaid_balance(
    server: str,  # noqa: F811
    browser: Browser,  # noqa: F811
    admin_key: str,
    seeded: World,
) -> None:
    # The admin's key on every request (pages take the API's principals; the sign-in form
    # has its own test in test_browser).
    headers = {"Authorization": f"Bearer {admin_key}"}
    context = browser.new_context(base_url=server, extra_http_headers=headers)
    page = context.new_page()
    page.goto("/dashboard/revenue")
    expect(page.get_by_role("heading", name="Revenue")).to_be_visible()
    api = context.request.get("/v1/revenue").json()
    for month in api["months"]:
        row = page.locator(f'tr[data-period="{month["period"]}"]')
        for key in ("total", "prepaid", "amount_due"):
            expect(row.locator(f'[data-api="{key}"]')).to_have_attribute("data-raw", month[key])
        for customer in month["customers"]:
            row = page.locator(f'tr[data-customer="{customer["customer_id"]}"]')
            expect(row.locator('[data-label="Customer"]')).to_have_text(customer["customer_name"])
            due = row.locator('[data-api="amount_due"]')
            expect(due).to_have_attribute("data-raw", customer["amount_due"])
    at_both_widths(page, "revenue", MONEY_SHOTS)
    # Nothing cut off at 1440 px: no table scrolls inside its box either.
    boxes = page.evaluate(
        "[...document.querySelectorAll('main .scroll')].map(e => [e.scrollWidth, e.clientWidth])"
    )
    assert boxes and all(inner <= outer for inner, outer in boxes), boxes
    context.close()
