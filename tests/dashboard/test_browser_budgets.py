"""Budgets in real headless Chromium at 1440 and 390 px: the page shows the API's spend and
forecast, and a customer creates, changes and deletes a budget with the page's own forms.
Screenshots of the budget pages go to docs/screenshots/ (committed)."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from app.core.db import transaction
from app.core.epoch import epoch
from app.simulate.history import SimGpu
from app.simulate.progress import Progress
from app.simulate.run import Options, simulate
from tests.dashboard import test_browser as chromium
from tests.dashboard.test_browser_widths import at_both_widths
from tests.harness import Console, bearer

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("browser")]
server = chromium.server
browser = chromium.browser

from playwright.sync_api import Browser, Page, expect  # noqa: E402

DOCS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
GPUS = ["GPU-NW-1", "GPU-NW-2", "GPU-NW-3", "GPU-NW-4"]


def northwind(console: Console, db: Engine) -> tuple[dict[str, str], str]:
    """Customer "Northwind AI" (USD): four H100s since the month began, healthy telemetry to
    now, and a whole-account budget just under its forecast. Its id and a customer key."""
    now = datetime.now(UTC)
    month = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    plan = console.plan("northwind", price="2.49", currency="USD")
    customer = console.customer("Northwind AI", currency="USD")
    node = console.node("node-nw")["node"]["id"]
    for gpu in GPUS:
        console.gpu(node, gpu)
    start = month.isoformat()
    rental = console.rental(customer["id"], plan["id"], gpu_count=len(GPUS), start_at=start)
    for gpu in GPUS:
        console.assign(rental["id"], gpu, start)
    with transaction(db) as session:
        gpus = [SimGpu(gpu, "NVIDIA H100 80GB HBM3") for gpu in GPUS]  # NVML name
        options = Options(start=epoch(month), end=epoch(now) - epoch(now) % 60, failure_rate=0)
        simulate(session, gpus, options, Progress(quiet=True))
    key = console.post(f"/v1/customers/{customer['id']}/keys", {"name": "finance"})["key"]
    return customer, key


def status(page: Page, customer_id: str, key: str) -> list[dict[str, Any]]:
    path = f"/v1/customers/{customer_id}/budgets/status"
    return list(page.request.get(path, headers=bearer(key)).json()["items"])


def test_budget_pages_create_change_and_delete_at_both_widths(
    server: str, browser: Browser, console: Console, db: Engine
) -> None:
    customer, key = northwind(console, db)
    usage = console.client.get(f"/v1/customers/{customer['id']}/usage", headers=console.headers)
    forecast = usage.json()["forecast"]
    assert Decimal(forecast) > 0
    amount = str((Decimal(forecast) * Decimal("0.95")).quantize(Decimal("0.01")))  # below forecast
    body = {
        "amount": amount,
        "thresholds": [
            {"percent": 50, "basis": "actual"},
            {"percent": 80, "basis": "actual"},
            {"percent": 100, "basis": "actual"},
            {"percent": 100, "basis": "forecast"},
        ],
    }
    console.post(f"/v1/customers/{customer['id']}/budgets", body)
    context = browser.new_context(base_url=server, viewport={"width": 1440, "height": 900})
    page = context.new_page()
    page.goto(chromium.portal_path(console, customer["id"]))
    [before] = status(page, customer["id"], key)
    page.get_by_role("link", name="Budgets").click()
    expect(page.get_by_role("heading", name="Budgets")).to_be_visible()
    [after] = status(page, customer["id"], key)
    row = page.locator(f'tr[data-budget="{before["budget"]["id"]}"]')
    expect(row.locator('[data-label="Spend"]')).to_have_attribute("data-raw", str(after["spend"]))
    # No telemetry after the last whole minute: each second since is unmetered, so the forecast
    # falls as the clock runs; the page's lies between the API's just before and just after.
    shown = row.locator('[data-label="Forecast"]').get_attribute("data-raw") or ""
    assert Decimal(str(before["forecast"])) >= Decimal(shown) >= Decimal(str(after["forecast"]))
    expect(row.locator("li.crossed")).to_have_text(
        f"100 % of forecast (${float(amount):,.2f}) reached"
    )
    expect(page.locator("main")).to_contain_text("The forecast assumes the cost so far")

    # A new budget for the one rental, from the form.
    page.get_by_label("Monthly amount").fill("1200")
    page.get_by_label("Applies to").select_option(index=1)
    page.get_by_label("Alert when spend so far reaches").fill("75, 100")
    page.get_by_label("Alert when the month-end forecast reaches").fill("")
    at_both_widths(page, "budgets", DOCS)
    page.get_by_role("button", name="Create budget").click()
    expect(page.locator("tr[data-budget]")).to_have_count(2)
    rental_budget = next(s for s in status(page, customer["id"], key) if s["budget"]["rental_id"])
    assert rental_budget["budget"]["amount"] == "1200.00"

    # Change it: a typo is refused in words, then the corrected form is saved.
    page.locator(f'tr[data-budget="{rental_budget["budget"]["id"]}"]').get_by_role(
        "link", name="Change"
    ).click()
    page.get_by_label("Alert when spend so far reaches").fill("75, 1OO")
    page.get_by_role("button", name="Save changes").click()
    expect(page.get_by_role("alert")).to_contain_text("'1OO' is not a whole percent")
    page.get_by_label("Monthly amount").fill("1500")
    page.get_by_label("Alert when spend so far reaches").fill("75, 100")
    at_both_widths(page, "budget-change", DOCS)
    page.get_by_role("button", name="Save changes").click()
    expect(page.get_by_role("heading", name="Budgets")).to_be_visible()
    changed = next(s for s in status(page, customer["id"], key) if s["budget"]["rental_id"])
    assert changed["budget"]["amount"] == "1500.00"

    # Delete it.
    page.locator(f'tr[data-budget="{changed["budget"]["id"]}"]').get_by_role(
        "link", name="Change"
    ).click()
    page.get_by_role("button", name="Delete budget").click()
    expect(page.locator("tr[data-budget]")).to_have_count(1)
    assert len(status(page, customer["id"], key)) == 1
    at_both_widths(page, "budgets-list", DOCS)
    context.close()
