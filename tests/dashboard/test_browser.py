"""The dashboard in real headless Chromium against the real service (`gpumeter serve`).

Signs in through a portal link, checks the overview against the JSON API, finds the failure
band and its evidence, downloads the PDF and reads its total, and makes sure a second
customer's link opens none of the first customer's pages. Screenshots of every page, at laptop
and phone widths, go to test-artifacts/dashboard/.
"""

from __future__ import annotations

import io
import itertools
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

# One xdist group: the module's service and Chromium start once, not on every worker.
pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("browser")]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
if not Path(CHROMIUM).exists() and os.environ.get("CI") != "true":
    pytest.skip("Debian's chromium is not installed (CI installs it)", allow_module_level=True)

from playwright.sync_api import (  # noqa: E402
    Browser,
    Locator,
    Page,
    Route,
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


DOCS_RENDER_TIMEOUT_MS = 30_000
# Beside the other end-to-end workers on two cores, a page with its charts can take longer than
# Playwright's 5-s default to render (a rental page's failure band was missed so once in CI).
expect.set_options(timeout=15_000)


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
    console_errors: list[str] = []
    page.on("console", lambda m: console_errors.append(m.text) if m.type == "error" else None)
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
    expect(page.get_by_role("heading", name="Cost for the month")).to_be_visible()
    expect(page.locator('[data-api="forecast"]')).to_have_count(0)  # October is closed
    failure_h = f"{usage['buckets_s']['failure_credit'] / 3600:,.2f}"
    expect(page.locator('[data-api="buckets_s.failure_credit"]')).to_have_text(failure_h)
    effective = page.locator('[data-api="effective.effective_gpu_hours"]')
    api_effective = usage["effective"]["effective_gpu_hours"]
    expect(effective).to_have_attribute("data-raw", api_effective)
    expect(effective).to_have_text(f"{Decimal(api_effective):,.2f}")
    shoot(page, "overview")

    # Rental page: the failure band, and its evidence on hover.
    page.get_by_role(
        "link", name="1 \u00d7 H100, 2026-10-10 02:00 to 2026-10-12 02:00 CEST"
    ).first.click()
    failed = page.locator('rect[data-state="failed"]')
    expect(failed).to_have_count(1)
    failed.hover()
    tip = page.locator("#tip")
    expect(tip).to_be_visible()
    expect(tip).to_have_text(
        "GPU-A-1 · Failed 2026-10-10 14:00:00 to 14:47:00 CEST (47 min 00 s)"
        " · XID 79: GPU has fallen off the bus"
    )
    # The charts open on the GPU the rental holds now (GPU-A-1 left it at 12:47).
    expect(page.locator("#gpu-pick")).to_have_value("GPU-A-2")
    expect(page.locator(".chart .plot svg path.line")).to_have_count(2)
    expect(page.locator(".chart").first.locator(".ylab")).to_have_text(["0 %", "50 %", "100 %"])
    for label in page.locator(".xlab, .range").all_text_contents():
        assert "/" not in label, label  # ISO dates, like the rest of the page
    expect(page.locator(".range")).to_contain_text("2026-10-10 02:00 CEST to 2026-10-12 02:00")
    no_overlap(page.locator(".axis span"))
    # A 30-second migration is a few pixels at this scale: its marker is still there to click.
    marker = page.locator(".incident-migration")
    box = marker.bounding_box()
    assert box and box["width"] >= 12 and box["height"] >= 10
    marker.click()  # zooms the charts to the migration, on the GPU it left, by the minute
    expect(page.locator("#gpu-pick")).to_have_value("GPU-A-1")
    expect(page.locator(".range")).to_contain_text("one point per minute")
    expect(page.locator(".range")).to_contain_text("2026-10-10 14:")
    expect(page.locator(".chart .plot svg path.line")).to_have_count(2)
    shoot(page, "rental")

    # Invoices: the list, one invoice, and its PDF.
    page.get_by_role("link", name="Invoices").click()
    shoot(page, "invoices")
    page.get_by_role("link", name=seeded.invoice["number"]).click()
    expect(page.locator('[data-api="steps.amount_due"]')).to_have_text(
        euros(seeded.invoice["amount_due"])
    )
    shoot(page, "invoice")
    at_phone_width_nothing_is_cut_off(page, "table.lines td")
    with page.expect_download() as download:
        page.get_by_role("link", name="Download PDF").click()
    pdf = PdfReader(io.BytesIO(Path(download.value.path()).read_bytes()))
    text = "\n".join(p.extract_text() for p in pdf.pages)
    assert seeded.invoice["number"] in text and euros(seeded.invoice["amount_due"]) in text
    download.value.save_as(SHOTS / "invoice.pdf")

    page.get_by_role("link", name="What-if").click()
    page.goto(f"/dashboard/what-if?period={PERIOD}")
    expect(page.locator("tr[data-increment]")).to_have_count(3)
    expect(page.locator("main")).not_to_contain_text("so far")
    shoot(page, "what-if")

    page.goto(f"/dashboard?period={PERIOD}")
    at_phone_width_nothing_is_cut_off(page, "table.stack td")
    # Incidents: one readable line, whose Evidence link opens the charts on the failure.
    incident = page.locator(".incident-item")
    expect(incident).to_have_count(1)
    expect(incident).to_contain_text("GPU-A-1 failed 2026-10-10 14:00:00 CEST: GPU stopped")
    expect(incident).to_contain_text("Moved to GPU-A-2, running again after 47 min 30 s")
    incident.get_by_role("link", name="Evidence").click()
    expect(page.locator("#gpu-pick")).to_have_value("GPU-A-1")
    expect(page.locator(".range")).to_contain_text("2026-10-10 13:30 CEST to 2026-10-10 15:00")
    expect(page.locator(".chart .plot svg path.line")).to_have_count(2)

    # Costs: a bar per day; the day of the failure shows its credit; numbers are the API's.
    page.get_by_role("link", name="Costs").click()
    page.goto(f"/dashboard/costs?period={PERIOD}")
    api = context.request.get(
        f"/v1/customers/{seeded.acme.customer['id']}/costs?period={PERIOD}"
    ).json()
    expect(page.locator(".daily .day")).to_have_count(31)
    expect(page.locator('[data-api="net"]')).to_have_text(euros(api["net"]))
    page.locator('.daily .day[data-day="2026-10-10"]').hover()
    expect(page.locator("#tip")).to_contain_text("credits -€1.97")
    shoot(page, "costs")
    at_phone_width_nothing_is_cut_off(page, "table.stack td")

    # Exports: the buttons download the CSVs.
    page.goto(f"/dashboard?period={PERIOD}")
    with page.expect_download() as focus:
        page.get_by_role("link", name="FOCUS 1.2 CSV").click()
    assert focus.value.suggested_filename == f"gpumeter-{PERIOD}-focus.csv"
    assert Path(focus.value.path()).read_text().startswith("BilledCost,BillingAccountId,")
    assert not console_errors, console_errors  # the favicon among them
    context.close()


def no_overlap(labels: Locator) -> None:
    boxes = [b for b in (labels.nth(i).bounding_box() for i in range(labels.count())) if b]
    assert len(boxes) >= 2
    for left, right in itertools.pairwise(sorted(boxes, key=lambda b: b["x"])):
        assert left["x"] + left["width"] <= right["x"], (left, right)


def at_phone_width_nothing_is_cut_off(page: Page, cells: str) -> None:
    """At 390 px every cell (an invoice's Rate and Amount included) lies inside the screen."""
    page.set_viewport_size(SIZES["phone"])
    try:
        for cell in page.locator(cells).all():
            box = cell.bounding_box()
            if box and box["width"]:
                assert box["x"] >= 0 and box["x"] + box["width"] <= 390 + 0.5, (cell, box)
    finally:
        page.set_viewport_size(SIZES["laptop"])


def test_errors_sign_out_and_docs_in_the_browser(
    server: str, browser: Browser, console: Console, seeded: World
) -> None:
    context = browser.new_context(base_url=server, viewport=SIZES["laptop"])
    page = context.new_page()
    page.goto("/dashboard/sign-in")
    expect(page.get_by_role("button", name="Sign out")).to_have_count(0)
    shoot(page, "sign-in")
    page.goto(portal_path(console, seeded.acme.customer["id"]))
    expect(page.get_by_role("button", name="Sign out")).to_be_visible()
    missing = "00000000-0000-0000-0000-000000000000"
    for path, heading, says in (
        (f"/dashboard/rentals/{missing}", "Not found", f"rental {missing} not found"),
        ("/dashboard?period=2026-13", "That address is not valid", "YYYY-MM"),
    ):
        response = page.goto(path)
        assert response and response.status >= 400
        expect(page.get_by_role("heading", name=heading)).to_be_visible()
        expect(page.get_by_role("alert")).to_contain_text(says)
        shoot(page, f"error-{response.status}")

    # /docs with every request off this host refused: Swagger UI still renders.
    offsite: list[str] = []

    def only_local(route: Route) -> None:
        if route.request.url.startswith(server):
            route.continue_()
        else:
            offsite.append(route.request.url)
            route.abort()

    page.route("**/*", only_local)
    page.goto("/docs")
    # The first /openapi.json builds a 240 KB schema (1.2 s on a quiet box) and Swagger UI
    # renders it; on a loaded 2-core box both together overran playwright's default 5 s.
    title = page.locator(".swagger-ui .info .title")
    expect(title).to_contain_text("gpumeter", timeout=DOCS_RENDER_TIMEOUT_MS)
    assert not offsite, offsite
    shoot(page, "docs")
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


def test_operator_pages(server: str, browser: Browser, admin_key: str, seeded: World) -> None:
    context = browser.new_context(base_url=server, viewport=SIZES["laptop"])
    page = context.new_page()
    page.goto("/dashboard/sign-in")
    page.get_by_label("API key").fill(admin_key)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Choose a customer")).to_be_visible()
    page.get_by_role("link", name="Fleet").click()
    api = context.request.get("/v1/fleet/summary").json()
    for group in api["groups"]:
        row = page.locator(f'tr[data-group="{group["model"]}/{group["datacenter"]}"]')
        expect(row.locator('[data-label="GPUs"]')).to_have_text(str(group["gpus"]))
    expect(page.locator('[data-api="detection.p50_s"]')).not_to_have_text("unknown")
    shoot(page, "fleet")
    at_phone_width_nothing_is_cut_off(page, "table.stack td")
    page.get_by_role("link", name="Revenue").click()
    expect(page.get_by_role("heading", name="Revenue")).to_be_visible()
    shoot(page, "revenue")
    context.close()


def test_budget_banner(server: str, browser: Browser, console: Console, seeded: World) -> None:
    acme = seeded.acme
    budget = console.client.post(
        f"/v1/customers/{acme.customer['id']}/budgets",
        json={"amount": "100", "hard_limit": True},
        headers={"Authorization": f"Bearer {acme.key}"},
    )
    assert budget.status_code == 201, budget.text
    context = browser.new_context(base_url=server, viewport=SIZES["laptop"])
    page = context.new_page()
    page.goto(portal_path(console, acme.customer["id"]))
    page.goto(f"/dashboard?period={PERIOD}")
    banner = page.get_by_role("status")
    expect(banner).to_contain_text("Spend has passed 100 % of your €100.00 monthly budget")
    expect(banner).to_contain_text("€117.55 (117.6 %)")
    # October is closed: the hard limit speaks of the current month, so it is not said here.
    expect(banner).not_to_contain_text("no new rentals")
    shoot(page, "budget-banner")
    context.close()


def test_prepaid_balance_card(
    server: str, browser: Browser, console: Console, seeded: World
) -> None:
    """The overview's prepaid balance is the balance API's, low until a top-up lifts it."""
    customer = seeded.acme.customer["id"]
    context = browser.new_context(base_url=server, viewport=SIZES["laptop"])
    page = context.new_page()
    page.goto(portal_path(console, customer))
    card = page.locator(".card", has=page.get_by_role("heading", name="Prepaid balance"))
    for top_up, low in (("1.50", True), ("10.00", False)):
        console.post(f"/v1/customers/{customer}/balance/top-ups", {"amount": top_up, "reason": "t"})
        page.goto(f"/dashboard?period={PERIOD}")
        api = context.request.get(f"/v1/customers/{customer}/balance").json()
        assert api["low"] is low
        expect(card.locator('[data-api="balance"]')).to_have_attribute("data-raw", api["balance"])
        expect(card.locator('[data-api="balance"]')).to_have_text(euros(api["balance"]))
        low_text = card.get_by_text(f"Low: below {euros(api['low_threshold'])}")
        expect(low_text).to_have_count(1 if low else 0)
        shoot(page, f"prepaid-balance-{'low' if low else 'topped-up'}")
    assert api["balance"] == "11.50"
    context.close()
