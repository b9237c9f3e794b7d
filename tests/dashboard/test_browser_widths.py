"""The pages issue 33 changed, in real headless Chromium at 1440 and 390 px: nothing scrolls
sideways, the numbers shown are the API's, and each page is saved as a screenshot under
test-artifacts/dashboard/widths/ (look at them: a test cannot judge a page as a person does).
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, ViewportSize, expect

from app.core.money import display
from tests.dashboard import test_browser as chromium
from tests.dashboard import world
from tests.dashboard.world import PERIOD, Tenant, World, ts
from tests.harness import Console

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("browser")]
# The service and Chromium, as the other browser tests start them (one each for this module).
server = chromium.server
browser = chromium.browser
portal_path = chromium.portal_path

SHOTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "dashboard" / "widths"
WIDTHS: dict[str, ViewportSize] = {
    "1440": {"width": 1440, "height": 900},
    "390": {"width": 390, "height": 844},
}
expect.set_options(timeout=15_000)


# GPU names as NVML gives them: 40 characters, where the seeded world's are 7.
LONG_NAMES = [
    "GPU-3f6c2b1e-9a4d-4c8e-b7f2-1d5e6a7b8c9d",
    "GPU-8e1d4c7b-2f5a-4b9e-a3c6-7d0e1f2a3b4c",
]


def long_named(console: Console) -> Tenant:
    """Customer "Long Names" (USD, New York): the seeded world's October rental, failure and
    migration, on GPUs with real-length names."""
    plan = console.plan("long-names", price="2.49", currency="USD")
    registered = console.node("node-long")
    for gpu in LONG_NAMES:
        console.gpu(registered["node"]["id"], gpu)
    zone = {"currency": "USD", "billing_timezone": "America/New_York"}
    tenant = world._tenant(console, "Long Names", plan["id"], LONG_NAMES, **zone)
    failed_gpu, spare = LONG_NAMES
    console.post(
        f"/v1/rentals/{tenant.rental['id']}/migrations",
        {
            "from_gpu_uuid": failed_gpu,
            "to_gpu_uuid": spare,
            "failed_at": world.MIGRATED_AT,
            "resumed_at": world.RESUMED_AT,
        },
    )
    failed, migrated = ts(world.FAILED_AT), ts(world.MIGRATED_AT)
    records = [
        *world._minutes(failed_gpu, ts(world.START), failed),
        *world._minutes(failed_gpu, failed, migrated, "failed"),
        *world._minutes(spare, ts(world.RESUMED_AT), ts(world.END)),
    ]
    token = registered["token"]["key"]
    world._ingest(console.client, token, records, world._failure_events(failed_gpu))
    return tenant


def euros(amount: str) -> str:
    return display(amount, "EUR")


def at_both_widths(page: Page, name: str, shots: Path = SHOTS) -> None:
    """At each width: no horizontal scroll (the page is no wider than the window), and a
    full-page screenshot in ``shots``."""
    shots.mkdir(parents=True, exist_ok=True)
    for label, size in WIDTHS.items():
        page.set_viewport_size(size)
        page.wait_for_function("document.fonts.status === 'loaded'")
        widths = page.evaluate(
            "[document.scrollingElement.scrollWidth, window.innerWidth,"
            " [...document.querySelectorAll('body *')].filter(e => e.getBoundingClientRect()"
            ".right > window.innerWidth + 0.5 && getComputedStyle(e).position !== 'fixed')"
            ".slice(0, 5).map(e => e.tagName + '.' + e.className)]"
        )
        assert widths[0] <= widths[1], f"{name} scrolls sideways at {label} px: {widths}"
        page.screenshot(path=shots / f"{name}-{label}.png", full_page=True)
    page.set_viewport_size(WIDTHS["1440"])


def customer_page(browser: Browser, server: str, console: Console, seeded: World) -> Page:
    context: BrowserContext = browser.new_context(base_url=server, viewport=WIDTHS["1440"])
    page = context.new_page()
    page.goto(portal_path(console, seeded.acme.customer["id"]))
    return page


def test_costs_in_money_by_group_and_range(
    server: str, browser: Browser, console: Console, seeded: World
) -> None:
    page = customer_page(browser, server, console, seeded)
    customer = seeded.acme.customer["id"]
    page.goto(f"/dashboard/costs?period={PERIOD}")
    api = page.request.get(f"/v1/customers/{customer}/costs?period={PERIOD}").json()
    expect(page.locator('[data-api="net"]')).to_have_text(euros(api["net"]))
    expect(page.locator(".daily .day")).to_have_count(31)
    # Days with money are the API's, to the cent, in every column.
    rows = page.locator(".daily-table tbody tr")
    shown = [d for d in api["days"] if d["billed_s"] or d["credited_s"] or Decimal(d["net"])]
    expect(rows).to_have_count(len(shown))
    for day in shown:
        row = page.locator(f'.daily-table tr[data-day="{day["day"]}"]')
        for label, key in (("Charged", "charged"), ("Credits", "credited"), ("Net", "net")):
            expect(row.locator(f'[data-label="{label}"]')).to_have_text(euros(day[key]))
    page.locator('.daily .day[data-day="2026-10-10"]').hover()
    expect(page.locator("#tip")).to_contain_text("credits -€1.97")
    # The rental by name, not a truncated id; its net is the API's group's.
    [group] = api["groups"]
    link = page.get_by_role("link", name=group["label"])
    expect(link).to_have_attribute("title", f"Rental {group['key']}")
    row = page.locator(f'tr[data-group="{group["key"]}"]')
    expect(row.locator('[data-label="Net"]')).to_have_text(euros(group["net"]))
    at_both_widths(page, "costs-month-by-rental")

    page.get_by_role("link", name="Datacenter").click()
    expect(page.locator('tr[data-group="fra1"] [data-label="Net"]')).to_have_text(euros(api["net"]))
    at_both_widths(page, "costs-month-by-datacenter")

    # A custom range through the form: exactly those days, their sum.
    page.locator("#range-start").fill("2026-10-09")
    page.locator("#range-end").fill("2026-10-12")
    page.get_by_role("button", name="Show").click()
    expect(page).to_have_url(
        f"{server}/dashboard/costs?group_by=datacenter&start=2026-10-09&end=2026-10-12"
    )
    ranged = page.request.get(
        f"/v1/customers/{customer}/costs?start=2026-10-09&end=2026-10-12&group_by=datacenter"
    ).json()
    expect(page.locator(".daily .day")).to_have_count(4)
    expect(page.locator('[data-api="net"]')).to_have_text(euros(ranged["net"]))
    assert (
        ranged["net"] == api["net"]
    )  # all of October's usage lies in those days (to 02:00 on the 12th, Berlin)
    at_both_widths(page, "costs-range")

    # A bad range is a page saying what is wrong, not a 500.
    page.locator("#range-start").fill("2026-10-11")
    page.locator("#range-end").fill("2026-10-01")
    page.get_by_role("button", name="Show").click()
    expect(page.get_by_role("alert")).to_contain_text("start 2026-10-11 is after end 2026-10-01")
    at_both_widths(page, "costs-bad-range")
    page.context.close()


def test_incidents_page_in_customer_words(
    server: str, browser: Browser, console: Console, seeded: World
) -> None:
    page = customer_page(browser, server, console, seeded)
    page.goto(f"/dashboard?period={PERIOD}")
    page.get_by_role("navigation", name="Dashboard").get_by_role("link", name="Incidents").click()
    expect(page.get_by_role("heading", name="Incidents", level=1)).to_be_visible()
    api = page.request.get(
        f"/v1/customers/{seeded.acme.customer['id']}/incidents?period={PERIOD}"
    ).json()
    [incident] = api["items"]
    item = page.locator(".incident-item")
    expect(item).to_contain_text(incident["summary"])
    expect(item).to_contain_text("GPU stopped responding (fell off the bus)")
    expect(item).to_contain_text("Moved to GPU-A-2, running again after 47 min 30 s")
    expect(item.get_by_role("link", name=incident["rental_name"])).to_be_visible()
    for internal in ("event GPU-A-1", "migration 1", "reported after", "xid_79", "unknown"):
        expect(page.locator("main")).not_to_contain_text(internal)
    expect(page.locator('[data-api="credited"]')).to_have_text(euros(incident["credited"]))
    at_both_widths(page, "incidents")
    page.context.close()


def test_rental_and_overview_fit_a_phone(
    server: str, browser: Browser, console: Console, seeded: World
) -> None:
    page = customer_page(browser, server, console, seeded)
    page.goto(f"/dashboard?period={PERIOD}")
    at_both_widths(page, "overview")
    page.goto(f"/dashboard/rentals/{seeded.acme.rental['id']}?period={PERIOD}")
    expect(page.locator(".chart .plot svg path.line")).to_have_count(2)
    # Chart ticks fall at round local times: whole hours over two days...
    ticks = page.locator(".xlab")
    expect(ticks.first).to_have_text("10-10 12:00")
    assert {t[-2:] for t in ticks.all_text_contents()} == {"00"}, ticks.all_text_contents()
    page.locator(".incident-migration").click()  # ...and whole 5 minutes zoomed in
    expect(page.locator(".range")).to_contain_text("one point per minute")
    expect(page.locator(".chart .plot svg path.line")).to_have_count(2)
    for tick in ticks.all_text_contents():
        assert int(tick[-2:]) % 5 == 0, tick
    at_both_widths(page, "rental")
    page.context.close()


def test_long_gpu_names_are_shown_whole_and_nothing_scrolls_sideways(
    server: str, browser: Browser, console: Console, seeded: World
) -> None:
    tenant = long_named(console)
    context = browser.new_context(base_url=server, viewport=WIDTHS["1440"])
    page = context.new_page()
    page.goto(portal_path(console, tenant.customer["id"]))
    page.goto(f"/dashboard/rentals/{tenant.rental['id']}?period={PERIOD}")
    expect(page.locator(".chart .plot svg path.line")).to_have_count(2)
    names = page.locator(".band-labels li")
    expect(names).to_have_text(LONG_NAMES)
    for label, size in WIDTHS.items():
        page.set_viewport_size(size)
        for name in names.all():  # not cut off: the whole name is drawn, inside the screen
            box = name.bounding_box()
            assert name.evaluate("e => e.scrollWidth <= e.clientWidth"), (label, box)
            assert box and box["x"] >= 0 and box["x"] + box["width"] <= size["width"], box
    at_both_widths(page, "rental-long-names")
    for path in ("/dashboard/costs", "/dashboard/incidents", "/dashboard"):
        page.goto(f"{path}?period={PERIOD}")
        at_both_widths(page, f"long-names-{path.rsplit('/', 1)[1]}")
    context.close()


def test_operator_pages_fit_and_speak_money(
    server: str, browser: Browser, admin_key: str, seeded: World
) -> None:
    context = browser.new_context(base_url=server, viewport=WIDTHS["1440"])
    page = context.new_page()
    page.goto("/")  # the root sends a person to the dashboard, here its sign-in
    expect(page).to_have_url(f"{server}/dashboard/sign-in?next=%2Fdashboard")
    page.get_by_label("API key").fill(admin_key)
    page.get_by_role("button", name="Sign in").click()
    page.get_by_role("link", name="Fleet").click()
    api = context.request.get("/v1/fleet/summary").json()
    for group in api["groups"]:
        row = page.locator(f'tr[data-group="{group["model"]}/{group["datacenter"]}"]')
        spare = row.locator('[data-label="Spare ready / target"]')
        expect(spare).to_have_text(f"{group['spare_ready']} / {group['spare_target']}")
        pool = next(
            p
            for p in api["spare_pools"]
            if (p["model"], p["datacenter"]) == (group["model"], group["datacenter"])
        )
        assert (group["spare_ready"], group["spare_target"]) == (pool["available"], pool["target"])
    expect(page.locator("main")).not_to_contain_text("unknown")
    at_both_widths(page, "fleet")
    page.get_by_role("link", name="Revenue").click()
    revenue = context.request.get("/v1/revenue").json()
    for month in revenue["months"]:
        row = page.locator(f'tr[data-period="{month["period"]}"]')
        expect(row.locator('[data-api="total"]')).to_have_text(euros(month["total"]))
    at_both_widths(page, "revenue")
    context.close()


# The longest name a rental may have, with no space to break it at.
LONG_RENTAL_NAME = "llama-3.1-70b-instruct-finetune-lr3e-5-bs512-ctx8192-seed42-eu-fra1-" + "x" * 32


def test_a_rental_is_called_by_its_name_and_the_longest_fits_a_phone(
    server: str, browser: Browser, console: Console, seeded: World
) -> None:
    rental = seeded.acme.rental["id"]
    assert len(LONG_RENTAL_NAME) == 100
    renamed = console.client.patch(
        f"/v1/rentals/{rental}", json={"name": LONG_RENTAL_NAME}, headers=console.headers
    )
    assert renamed.status_code == 200, renamed.text
    page = customer_page(browser, server, console, seeded)
    page.goto(f"/dashboard?period={PERIOD}")
    links = page.get_by_role("link", name=LONG_RENTAL_NAME, exact=True)
    expect(links).to_have_count(3)  # the rentals table and the two latest events
    at_both_widths(page, "overview-named")
    links.first.click()
    expect(page).to_have_title(f"Rental {LONG_RENTAL_NAME} \u00b7 gpumeter")
    expect(page.get_by_role("heading", level=1)).to_have_text(LONG_RENTAL_NAME)
    at_both_widths(page, "rental-named")
    for path in ("costs", "incidents"):
        page.goto(f"/dashboard/{path}?period={PERIOD}")
        link = page.get_by_role("link", name=LONG_RENTAL_NAME, exact=True)
        expect(link).to_have_attribute("title", f"Rental {rental}")
        at_both_widths(page, f"{path}-named")
    page.context.close()
