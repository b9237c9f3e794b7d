"""The dashboard in real headless Chromium against the real service (`gpumeter serve`).

Signs in through a portal link, checks the overview against the JSON API, finds the failure
band and its evidence, downloads the PDF and reads its total, and makes sure a second
customer's link opens none of the first customer's pages. Screenshots of every page, at laptop
and phone widths, go to test-artifacts/dashboard/.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest
from pypdf import PdfReader

from app.core.local_service import free_port, wait_until_ready
from app.core.processes import stop_child
from app.settings import get_settings
from tests.dashboard.world import PERIOD, World
from tests.harness import Console

pytestmark = pytest.mark.e2e

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
if not Path(CHROMIUM).exists() and os.environ.get("CI") != "true":
    pytest.skip("Debian's chromium is not installed (CI installs it)", allow_module_level=True)

from playwright.sync_api import (  # noqa: E402
    Browser,
    Page,
    ViewportSize,
    expect,
    sync_playwright,
)

ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SHOTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "dashboard"
SIZES: dict[str, ViewportSize] = {
    "laptop": {"width": 1280, "height": 800},
    "phone": {"width": 390, "height": 844},
}


@pytest.fixture(scope="module")
def server(database_url: str) -> Iterator[str]:
    """`gpumeter serve` on the run's database, signing with the same key as the tests."""
    port = free_port()
    env = {
        **os.environ,
        "GPUMETER_DATABASE_URL": database_url,
        "GPUMETER_SECRET_KEY": get_settings().secret_key or "",
    }
    gpumeter = Path(sys.executable).parent / "gpumeter"
    process = subprocess.Popen([str(gpumeter), "serve", "--port", str(port)], env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(base, process, timeout_s=60)
        yield base
    finally:
        stop_child(process, "service")


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield browser
        browser.close()


def portal_path(console: Console, customer_id: str) -> str:
    url = console.post(f"/v1/customers/{customer_id}/portal-links", {})["url"]
    return "/dashboard/portal/" + url.rsplit("/", 1)[1]


def shoot(page: Page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    for size_name, size in SIZES.items():
        page.set_viewport_size(size)
        page.screenshot(path=SHOTS / f"{name}-{size_name}.png", full_page=True)
    page.set_viewport_size(SIZES["laptop"])


def euros(amount: str) -> str:
    return f"€{Decimal(amount):,.2f}"


def test_customer_journey(server: str, browser: Browser, console: Console, seeded: World) -> None:
    context = browser.new_context(base_url=server, viewport=SIZES["laptop"], accept_downloads=True)
    page = context.new_page()
    page.goto(portal_path(console, seeded.acme.customer["id"]))
    expect(page).to_have_url(f"{server}/dashboard")
    cookie = next(c for c in context.cookies() if c["name"] == "gpumeter_session")
    assert cookie["httpOnly"] and cookie["secure"] and cookie["sameSite"] == "Lax"

    # Overview: the numbers are the usage API's, read with the same session.
    page.goto(f"/dashboard?period={PERIOD}")
    usage = context.request.get(
        f"/v1/customers/{seeded.acme.customer['id']}/usage?period={PERIOD}"
    ).json()
    expect(page.locator('[data-api="cost_to_date"]')).to_have_text(euros(usage["cost_to_date"]))
    expect(page.locator('[data-api="forecast"]')).to_have_text(euros(usage["forecast"]))
    failure_h = f"{usage['buckets_s']['failure_credit'] / 3600:,.2f}"
    expect(page.locator('[data-api="buckets_s.failure_credit"]')).to_have_text(failure_h)
    effective = page.locator('[data-api="effective.effective_gpu_hours"]')
    api_effective = usage["effective"]["effective_gpu_hours"]
    expect(effective).to_have_attribute("data-raw", api_effective)
    expect(effective).to_have_text(f"{Decimal(api_effective):,.2f}")
    shoot(page, "overview")

    # Rental page: the failure band, and its evidence on hover.
    page.get_by_role("link", name=seeded.acme.rental["id"][:8]).click()
    failed = page.locator('rect[data-state="failed"]')
    expect(failed).to_have_count(1)
    failed.hover()
    tip = page.locator("#tip")
    expect(tip).to_be_visible()
    expect(tip).to_contain_text("xid_79_fallen_off_bus")
    expect(tip).to_contain_text("2026-10-10 14:00:00 CEST")
    expect(page.locator(".chart .plot svg path.line")).to_have_count(2)
    failed.click()  # zooms the charts to the failure, at minute resolution
    expect(page.locator(".range")).to_contain_text("one point per minute")
    expect(page.locator(".chart .plot svg path.line")).to_have_count(2)
    shoot(page, "rental")

    # Invoices: the list, one invoice, and its PDF.
    page.get_by_role("link", name="Invoices").click()
    shoot(page, "invoices")
    page.get_by_role("link", name=seeded.invoice["number"]).click()
    expect(page.locator('[data-api="total"]')).to_have_text(euros(seeded.invoice["total"]))
    shoot(page, "invoice")
    with page.expect_download() as download:
        page.get_by_role("link", name="Download PDF").click()
    pdf = PdfReader(io.BytesIO(Path(download.value.path()).read_bytes()))
    text = "\n".join(p.extract_text() for p in pdf.pages)
    assert seeded.invoice["number"] in text and euros(seeded.invoice["total"]) in text
    download.value.save_as(SHOTS / "invoice.pdf")

    page.get_by_role("link", name="What-if").click()
    page.goto(f"/dashboard/what-if?period={PERIOD}")
    expect(page.locator("tr[data-increment]")).to_have_count(3)
    shoot(page, "what-if")
    context.close()


def test_second_customer_link_opens_nothing_of_the_first(
    server: str, browser: Browser, console: Console, seeded: World
) -> None:
    context = browser.new_context(base_url=server, viewport=SIZES["laptop"])
    page = context.new_page()
    page.goto(portal_path(console, seeded.other.customer["id"]))
    expect(page.locator(".customer")).to_have_text("Other")
    acme, rental, invoice = seeded.acme.customer["id"], seeded.acme.rental["id"], seeded.invoice
    for path in (
        f"/dashboard/rentals/{rental}?period={PERIOD}",
        f"/dashboard/invoices/{invoice['id']}",
        f"/dashboard/invoices/{invoice['id']}/pdf",
        f"/dashboard?customer={acme}",
        f"/dashboard/what-if?customer={acme}",
        f"/v1/customers/{acme}/usage?period={PERIOD}",
        "/v1/gpus/GPU-A-1/timeline?start=2026-10-10T00:00:00Z&end=2026-10-11T00:00:00Z",
    ):
        assert context.request.get(path).status == 404, path
    page.goto(f"/dashboard?period={PERIOD}")
    html = page.content()
    assert "Acme" not in html and rental not in html and "GPU-A-1" not in html
    shoot(page, "other-customer-overview")
    context.close()
