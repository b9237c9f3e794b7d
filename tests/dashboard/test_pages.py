"""Server-side dashboard tests: sign-in, the pages' numbers against the API, PDF, tenancy."""

from __future__ import annotations

import io
import re
import time
from datetime import UTC, datetime
from decimal import Decimal
from html import escape as html_escape
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pypdf import PdfReader

from app.billing import rollups
from app.billing.endpoints import clock
from app.dashboard import bands, sessions, tokens
from app.settings import get_settings
from tests.dashboard import world
from tests.dashboard.world import PERIOD, World, ts
from tests.harness import Console, bearer

PAGES = [
    "/dashboard?period={period}",
    "/dashboard/rentals/{rental}?period={period}",
    "/dashboard/invoices",
    "/dashboard/invoices/{invoice}",
    "/dashboard/invoices/{invoice}/pdf",
    "/dashboard/what-if?period={period}",
    "/dashboard/costs?period={period}",
    "/dashboard/costs?start=2026-10-05&end=2026-10-11&group_by=datacenter",
    "/dashboard/incidents?period={period}",
]


def paths(w: World) -> list[str]:
    ids = {"period": PERIOD, "rental": w.acme.rental["id"], "invoice": w.invoice["id"]}
    return [p.format(**ids) for p in PAGES]


def portal_link(console: Console, customer_id: str) -> str:
    return console.post(f"/v1/customers/{customer_id}/portal-links", {"ttl_s": 3600})["url"]


def sign_in_with_link(client: TestClient, url: str) -> None:
    response = client.get(url, follow_redirects=False)
    assert response.status_code == 303 and response.headers["location"] == "/dashboard"
    cookie = response.headers["set-cookie"]
    for flag in ("HttpOnly", "Secure", "SameSite=lax"):
        assert flag.lower() in cookie.lower(), cookie


def raw(html: str, key: str) -> str:
    match = re.search(rf'data-api="{re.escape(key)}"[^>]*data-raw="([^"]*)"', html)
    assert match, f"{key} not on the page"
    return match.group(1)


def test_portal_link_signs_in_and_every_page_renders(
    client: TestClient, console: Console, seeded: World
) -> None:
    sign_in_with_link(client, portal_link(console, seeded.acme.customer["id"]))
    for path in paths(seeded):
        response = client.get(path)
        assert response.status_code == 200, (path, response.text[:300])
        assert response.headers["cache-control"] == "private, no-store"


def test_overview_numbers_equal_the_api(client: TestClient, seeded: World) -> None:
    key = seeded.acme.key
    api = client.get(
        f"/v1/customers/{seeded.acme.customer['id']}/usage?period={PERIOD}", headers=bearer(key)
    ).json()
    html = client.get(f"/dashboard?period={PERIOD}", headers=bearer(key)).text
    assert raw(html, "cost_to_date") == api["cost_to_date"]
    assert raw(html, "vouchers.usable") == api["vouchers"]["usable"]
    for bucket in ("billable", "failure_credit", "migration_credit", "unmetered"):
        assert int(raw(html, f"buckets_s.{bucket}")) == api["buckets_s"][bucket]
    assert raw(html, "effective.effective_gpu_hours") == api["effective"]["effective_gpu_hours"]
    assert api["buckets_s"]["failure_credit"] == 47 * 60 and api["buckets_s"]["migration_credit"]
    assert "€" in html and "Became failed (XID 79: GPU has fallen off the bus)" in html
    # October is over: its figures are the month's, not "to date", and nothing is forecast.
    assert "Cost for the month" in html and "Cost to date" not in html and "forecast" not in html


def test_rental_page_shows_the_failure_band_with_its_evidence(
    client: TestClient, seeded: World
) -> None:
    path = f"/dashboard/rentals/{seeded.acme.rental['id']}?period={PERIOD}"
    html = client.get(path, headers=bearer(seeded.acme.key)).text
    failed = re.findall(r'<rect class="piece st-failed"[^>]*data-tip="([^"]*)"', html)
    # Times are the customer's (Berlin, CEST in October): 12:00 UTC is 14:00.
    assert failed == [
        "GPU-A-1 · Failed 2026-10-10 14:00:00 to 14:47:00 CEST (47 min 00 s)"
        " · XID 79: GPU has fallen off the bus"
    ]
    assert 'class="piece st-migration"' in html and 'class="link"' in html
    # No tooltip shows internal fields (key=value, epoch seconds, rule identifiers).
    for tip in re.findall(r'data-tip="([^"]*)"', html):
        assert "=" not in tip and "_" not in tip.split(" · ", 1)[1], tip


def test_a_rental_with_more_gpus_than_a_page_pages_its_bands(
    client: TestClient, seeded: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bands, "GPUS_PER_PAGE", 1)  # the seeded rental's two GPUs: two pages
    path = f"/dashboard/rentals/{seeded.acme.rental['id']}?period={PERIOD}"
    headers = bearer(seeded.acme.key)

    def rows(html: str) -> list[str]:
        return re.findall(r'<g data-gpu="([^"]+)"', html)

    first = client.get(path, headers=headers).text
    assert rows(first) == ["GPU-A-1"] and "GPUs 1\N{EN DASH}1 of 2" in first
    rental = seeded.acme.rental["id"]
    assert f'rel="next" href="/dashboard/rentals/{rental}?period={PERIOD}&amp;gpu_page=2"' in first
    # GPU-A-1's migration band stays; the link to GPU-A-2, on the next page, is not drawn.
    assert 'class="piece st-migration"' in first and 'class="link"' not in first
    second = client.get(f"{path}&gpu_page=2", headers=headers).text
    assert rows(second) == ["GPU-A-2"] and "GPUs 2\N{EN DASH}2 of 2" in second
    assert 'rel="prev"' in second and 'rel="next"' not in second
    past = client.get(f"{path}&gpu_page=3", headers=headers)
    assert past.status_code == 422
    assert "gpu_page 3 is past the last page (2) of GPUs in this rental" in past.text
    assert client.get(f"{path}&gpu_page=0", headers=headers).status_code == 422


def test_latest_events_show_the_failure_that_ended_the_assignment(
    client: TestClient, console: Console
) -> None:
    zed = world.failover_at_the_event(console)
    html = client.get(f"/dashboard?period={PERIOD}", headers=bearer(zed.key)).text
    events = html[html.index('id="events-h"') :]
    assert "Became failed (XID 79: GPU has fallen off the bus)" in events
    assert "GPU-Z-1" in events and "No health events" not in events


def test_an_open_month_says_to_date_and_forecasts(
    app: FastAPI, client: TestClient, seeded: World
) -> None:
    app.dependency_overrides[clock] = lambda: datetime(2026, 10, 11, 0, 0, tzinfo=UTC)
    try:
        headers = bearer(seeded.acme.key)
        api = client.get(
            f"/v1/customers/{seeded.acme.customer['id']}/usage?period={PERIOD}", headers=headers
        ).json()
        html = client.get(f"/dashboard?period={PERIOD}", headers=headers).text
        what_if = client.get(f"/dashboard/what-if?period={PERIOD}", headers=headers).text
    finally:
        app.dependency_overrides.pop(clock)
    assert "Cost to date" in html and "Cost for the month" not in html
    assert raw(html, "cost_to_date") == api["cost_to_date"]
    assert raw(html, "forecast") == api["forecast"] != api["cost_to_date"]
    assert "so far" in what_if


def test_rental_page_marks_incidents_and_opens_on_the_gpu_it_holds(
    client: TestClient, seeded: World
) -> None:
    path = f"/dashboard/rentals/{seeded.acme.rental['id']}?period={PERIOD}"
    html = client.get(path, headers=bearer(seeded.acme.key)).text
    markers = re.findall(
        r'<button type="button" class="incident incident-(\w+)" data-gpu="([^"]+)"', html
    )
    assert markers == [("failed", "GPU-A-1"), ("migration", "GPU-A-1")]
    # GPU-A-1 left the rental at 12:47; the charts open on GPU-A-2, which has data.
    assert re.search(r'<option value="GPU-A-2" selected>', html)
    assert not re.search(r'<option value="GPU-A-1" selected>', html)
    # Axis labels at whole local hours (02:00 CEST to 02:00 two days later), four of them.
    ticks = re.findall(r'<div class="axis"[^>]*>(.*?)</div>', html)[0]
    labels = re.findall(r">([^<]+)</span>", ticks)
    assert labels == ["10-10 12:00", "10-11 00:00", "10-11 12:00", "10-12 00:00"]


def test_invoice_page_and_pdf_show_the_invoice_total(client: TestClient, seeded: World) -> None:
    inv = seeded.invoice
    headers = bearer(seeded.acme.key)
    html = client.get(f"/dashboard/invoices/{inv['id']}", headers=headers).text
    total = f"€{Decimal(inv['amount_due']):,.2f}"
    assert f'data-api="steps.amount_due">{total}<' in html and inv["number"] in html
    response = client.get(f"/dashboard/invoices/{inv['id']}/pdf", headers=headers)
    assert response.headers["content-type"] == "application/pdf"
    text = "\n".join(p.extract_text() for p in PdfReader(io.BytesIO(response.content)).pages)
    assert inv["number"] in text and total in text
    assert "Failure credit" in text and "XID 79: GPU has fallen off the bus" in text


def test_what_if_equals_the_api(client: TestClient, seeded: World) -> None:
    headers = bearer(seeded.acme.key)
    api = client.get(
        f"/v1/customers/{seeded.acme.customer['id']}/what-if?period={PERIOD}", headers=headers
    ).json()
    html = client.get(f"/dashboard/what-if?period={PERIOD}", headers=headers).text
    assert "so far" not in html  # October is closed
    shown = re.findall(r'class="num diff" data-raw="([^"]*)"', html)
    assert shown == [row["difference"] for row in api["rows"]]
    assert [r["increment_s"] for r in api["rows"]] == [1, 60, 3600]


def test_another_customer_opens_none_of_the_pages(
    client: TestClient, console: Console, seeded: World
) -> None:
    sign_in_with_link(client, portal_link(console, seeded.other.customer["id"]))
    for path in paths(seeded):
        own = ("/dashboard?", "/dashboard/what-if", "/dashboard/costs", "/dashboard/incidents")
        if path.startswith(own) or path.endswith("invoices"):
            continue  # their own pages: checked below for leaks
        assert client.get(path).status_code == 404, path
        named = path + ("&" if "?" in path else "?") + f"customer={seeded.acme.customer['id']}"
        assert client.get(named).status_code == 404, named
    markers = [seeded.acme.customer["id"], seeded.acme.rental["id"], "GPU-A-1", "Acme"]
    own_pages = ("/dashboard", "/dashboard/invoices", "/dashboard/what-if", "/dashboard/costs")
    for path in (*own_pages, "/dashboard/incidents"):
        for query in ("", f"?customer={seeded.other.customer['id']}"):
            html = client.get(path + query).text
            assert not [m for m in markers if m in html], path
        own = client.get(path + f"?customer={seeded.acme.customer['id']}")
        assert own.status_code == 404
    for asset in ("dashboard.css", "dashboard.js"):
        body = client.get(f"/dashboard/static/{asset}").text
        assert not [m for m in markers if m in body]


def test_cookie_reads_the_json_api_but_never_writes(
    client: TestClient, console: Console, seeded: World
) -> None:
    sign_in_with_link(client, portal_link(console, seeded.acme.customer["id"]))
    gpu = client.get(
        "/v1/gpus/GPU-A-1/metrics?start=2026-10-10T00:00:00Z&end=2026-10-11T00:00:00Z&step=3600"
    )
    assert gpu.status_code == 200 and gpu.json()["points"]
    assert (
        client.get(
            "/v1/gpus/GPU-B-1/metrics?start=2026-10-10T00:00:00Z&end=2026-10-11T00:00:00Z"
        ).status_code
        == 404
    )
    assert client.post("/v1/keys", json={"name": "x"}).status_code == 401


def test_bad_expired_and_swapped_tokens_are_refused(
    client: TestClient, console: Console, seeded: World
) -> None:
    url = portal_link(console, seeded.acme.customer["id"])
    token = url.rsplit("/", 1)[1]
    secret = get_settings().secret_key or ""
    expired = tokens.sign(
        secret, tokens.Purpose.PORTAL, {"cid": "x", "lid": "y"}, int(time.time()) - 1
    )
    forged = token[:-2] + ("AA" if not token.endswith("AA") else "BB")
    for bad in (expired, forged):
        assert client.get(f"/dashboard/portal/{bad}", follow_redirects=False).status_code == 401
    # A portal token is not a session, so it cannot be pasted in as the cookie.
    client.cookies.set(sessions.COOKIE_NAME, token, domain="testserver")
    response = client.get("/dashboard", follow_redirects=False)
    assert response.status_code == 303 and "/dashboard/sign-in" in response.headers["location"]


def test_api_key_sign_in_and_admin_view(client: TestClient, admin_key: str, seeded: World) -> None:
    response = client.post(
        "/dashboard/sign-in",
        data={"api_key": "gm_customer_wrong", "next": "/dashboard"},
        follow_redirects=False,
    )
    assert "error=invalid" in response.headers["location"]
    response = client.post(
        "/dashboard/sign-in",
        data={"api_key": admin_key, "next": "https://evil.test/"},
        follow_redirects=False,
    )
    assert response.headers["location"] == "/dashboard"
    assert (
        client.get("/dashboard", follow_redirects=False).headers["location"]
        == "/dashboard/customers"
    )
    picker = client.get("/dashboard/customers").text
    assert "Acme" in picker and "Other" in picker
    acme = seeded.acme.customer["id"]
    html = client.get(f"/dashboard?customer={acme}&period={PERIOD}").text
    assert "admin view" in html and f"customer={acme}" in html


def test_only_people_sign_in_a_node_or_scheduler_key_is_refused(
    client: TestClient, console: Console
) -> None:
    """The dashboard is for operators and customers: a node's token or a scheduler adapter's
    key, valid on the API, opens no session there."""
    scheduler = console.post("/v1/keys/scheduler", {"name": "slurm"})["key"]
    for key in (scheduler, console.node()["token"]["key"]):
        response = client.post(
            "/dashboard/sign-in",
            data={"api_key": key, "next": "/dashboard"},
            follow_redirects=False,
        )
        assert "error=invalid" in response.headers["location"]
        assert sessions.COOKIE_NAME not in client.cookies


def test_signed_out_browser_is_sent_to_sign_in(client: TestClient, seeded: World) -> None:
    response = client.get(f"/dashboard/what-if?period={PERIOD}", follow_redirects=False)
    assert response.status_code == 303
    assert response.headers["location"].startswith("/dashboard/sign-in?next=")  # relative
    assert client.get("/dashboard/sign-in").status_code == 200


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("/dashboard?period=2026-13", "period must be a month written YYYY-MM"),
        ("/dashboard?period=2099-01", "2099-01"),
    ],
)
def test_bad_periods_are_422_pages(client: TestClient, seeded: World, path: str, says: str) -> None:
    response = client.get(path, headers=bearer(seeded.acme.key))
    assert response.status_code == 422
    assert response.headers["content-type"].startswith("text/html")
    assert says in response.text and "Back to the overview" in response.text


def test_unknown_rental_is_a_404_page_and_the_api_stays_json(
    client: TestClient, seeded: World
) -> None:
    headers = bearer(seeded.acme.key)
    missing = "00000000-0000-0000-0000-000000000000"
    page = client.get(f"/dashboard/rentals/{missing}", headers=headers)
    assert page.status_code == 404 and page.headers["content-type"].startswith("text/html")
    assert f"rental {missing} not found" in page.text and '"detail"' not in page.text
    api = client.get(f"/v1/rentals/{missing}", headers=headers)
    assert api.status_code == 404 and api.json()["detail"][0]["type"] == "not_found"


def test_signed_out_page_offers_no_sign_out_and_favicon_is_served(client: TestClient) -> None:
    html = client.get("/dashboard/sign-in").text
    assert "Sign out" not in html and 'rel="icon"' in html
    icon = client.get("/favicon.ico")
    assert icon.status_code == 200 and icon.headers["content-type"] == "image/x-icon"
    assert icon.content[:4] == b"\x00\x00\x01\x00"  # an ICO header


def test_docs_are_served_without_a_cdn(client: TestClient) -> None:
    html = client.get("/docs").text
    assert "cdn." not in html and "https://" not in html.split("<body>")[0]
    assets = re.findall(r'(?:src|href)="([^"]+\.(?:js|css))"', html)
    assert assets, html
    for asset in assets:
        assert client.get(asset).status_code == 200, asset


def test_a_live_incident_shows_its_estimated_credit_before_the_invoice_is_drafted(
    client: TestClient, console: Console
) -> None:
    """Zed's GPU fails and its job runs again on a spare 47 min 30 s later; no invoice run has
    drafted October: the incident shows the credit rated so far, marked as an estimate, the
    same cents the drafted invoice then credits (2,850 s x 2.00/h = 1.58)."""
    zed = world.failover_at_the_event(console)
    path = f"/v1/customers/{zed.customer['id']}/incidents?period={PERIOD}"
    [live] = client.get(path, headers=bearer(zed.key)).json()["items"]
    assert (live["credited"], live["credited_s"], live["credit_estimated"]) == ("1.58", 2850, True)
    assert live["summary"].endswith(
        "Estimated credit so far \u20ac1.58 for 47 min 30 s, on this month's invoice once it "
        "is drafted"
    )
    page = client.get(f"/dashboard/incidents?period={PERIOD}", headers=bearer(zed.key)).text
    assert "Estimated credit so far \u20ac1.58" in page
    run = console.post(
        "/v1/invoices/runs",
        {"period": PERIOD, "customer_id": zed.customer["id"], "force": True},
        status=200,
    )
    draft = client.get(f"/v1/invoices/{run['invoice_ids'][0]}", headers=console.headers).json()
    credits = [Decimal(x["amount"]) for x in draft["lines"] if x["kind"].endswith("_credit")]
    [drafted] = client.get(path, headers=bearer(zed.key)).json()["items"]
    assert (drafted["credited"], drafted["credit_estimated"]) == ("1.58", False)
    assert -sum(credits) == Decimal(drafted["credited"])


def test_incidents_read_for_a_person_and_equal_the_invoice_credits(
    client: TestClient, seeded: World
) -> None:
    headers = bearer(seeded.acme.key)
    api = client.get(
        f"/v1/customers/{seeded.acme.customer['id']}/incidents?period={PERIOD}", headers=headers
    ).json()
    [incident] = api["items"]
    credits = [
        Decimal(line["amount"])
        for line in seeded.invoice["lines"]
        if line["kind"] in ("failure_credit", "migration_credit")
    ]
    assert Decimal(incident["credited"]) == -sum(credits) == Decimal("1.97")
    assert (incident["gpu_uuid"], incident["moved_to_gpu"], incident["downtime_s"]) == (
        "GPU-A-1",
        "GPU-A-2",
        47 * 60 + 30,
    )
    # In the customer's words: the cause, where the job went, the credit; no internal ids.
    assert incident["summary"] == (
        "GPU-A-1 failed 2026-10-10 14:00:00 CEST: GPU stopped responding (fell off the bus)"
        " \u2014 GPU taken out of service. Moved to GPU-A-2, running again after 47 min 30 s."
        " Credited \u20ac1.97"
    )
    assert incident["outcome"] == "moved" and incident["evidence"].startswith("XID 79")
    # The failover the service opened when it heard of the failure (57 days on: the seed sends
    # history late) came after the job ran on GPU-A-2: its timeline is not this incident's.
    assert incident["failover"] is None
    assert incident["rental_name"] == "1 \u00d7 H100, 2026-10-10 02:00 to 2026-10-12 02:00 CEST"
    rental = seeded.acme.rental["id"]
    pages = ("/dashboard", f"/dashboard/rentals/{rental}", "/dashboard/incidents")
    for path in (f"{page}?period={PERIOD}" for page in pages):
        html = client.get(path, headers=headers).text
        assert html_escape(incident["summary"], quote=False) in html, path
        assert "event GPU-A-1" not in html and "migration " not in html, path
        assert f"focus=GPU-A-1%40{ts(world.FAILED_AT)}" in html, path
    other = client.get(
        f"/v1/customers/{seeded.other.customer['id']}/incidents?period={PERIOD}",
        headers=bearer(seeded.other.key),
    ).json()
    assert other["items"] == []


def test_revenue_shows_the_current_month_to_date_per_customer(
    app: FastAPI, client: TestClient, console: Console, seeded: World
) -> None:
    """On 11 Oct 00:00 UTC no invoice covers October for Other: the revenue page's current
    month holds its usage so far, rated as its invoice will be (24 h x 2.49 = 59.76), marked
    to date, beside Acme's finalized invoice."""
    app.dependency_overrides[clock] = lambda: datetime(2026, 10, 11, 0, 0, tzinfo=UTC)
    try:
        api = client.get(f"/v1/revenue?first={PERIOD}&last={PERIOD}", headers=console.headers)
        page = client.get("/dashboard/revenue", headers=console.headers).text
    finally:
        app.dependency_overrides.pop(clock)
    (month,) = api.json()["months"]
    by_name = {c["customer_name"]: c for c in month["customers"]}
    other, acme = by_name["Other"], by_name["Acme"]
    assert (other["to_date"], other["invoices"], other["billed"]) == (True, 0, "59.76")
    assert (acme["to_date"], acme["invoices"]) == (False, 1)
    assert acme["amount_due"] == seeded.invoice["total"] and month["to_date"]
    assert Decimal(month["billed"]) == Decimal(acme["billed"]) + Decimal("59.76")
    row = page[page.index(f'data-customer="{other["customer_id"]}"') :].split("</tr>")[0]
    assert "to date" in row and 'data-api="billed" data-raw="59.76"' in row


def test_a_days_charge_is_its_gpu_hours_times_the_rate_unmetered_time_on_its_own_day(
    client: TestClient, console: Console
) -> None:
    """Gap rents an H100 at 2.49/h for 10 and 11 Oct (UTC); its node sends nothing from
    11 Oct 00:00 to 12:00 (unmetered: not billed). The 36 billed GPU-hours cost 89.64: day 1
    is 24 h x 2.49 = 59.76, day 2 12 h x 2.49 = 29.88 (the missing half-day is day 2's, not
    spread over both), and the days add up to the invoice's charge line, to the cent."""
    plan = console.plan("gap-plan", price="2.49", currency="EUR")
    registered = console.node("node-gap")
    console.gpu(registered["node"]["id"], "GPU-G-1")
    gap = console.customer("Gap", currency="EUR", billing_timezone="UTC")
    rental = console.rental(gap["id"], plan["id"], start_at=world.START, end_at=world.END)
    console.assign(rental["id"], "GPU-G-1", world.START)
    start, noon = ts(world.START), ts("2026-10-11T12:00:00Z")
    records = [
        *world._minutes("GPU-G-1", start, start + 86_400),
        *world._minutes("GPU-G-1", noon, ts(world.END)),
    ]
    world._ingest(client, registered["token"]["key"], records, [])
    key = console.post(f"/v1/customers/{gap['id']}/keys", {"name": "finance"})["key"]
    costs = client.get(
        f"/v1/customers/{gap['id']}/costs?period={PERIOD}", headers=bearer(key)
    ).json()
    days = {d["day"]: d for d in costs["days"] if d["billed_s"]}
    assert {day: (d["billed_s"], d["charged"]) for day, d in days.items()} == {
        "2026-10-10": (86_400, "59.76"),
        "2026-10-11": (43_200, "29.88"),
    }
    for d in days.values():
        assert Decimal(d["charged"]) == Decimal(d["billed_s"]) * Decimal("2.49") / 3600
    run = console.post(
        "/v1/invoices/runs", {"period": PERIOD, "customer_id": gap["id"], "force": True}, 200
    )
    invoice = client.get(f"/v1/invoices/{run['invoice_ids'][0]}", headers=console.headers)
    [charge] = [x for x in invoice.json()["lines"] if x["kind"] == "charge"]
    assert Decimal(charge["amount"]) == sum(Decimal(d["charged"]) for d in days.values())


def test_costs_by_day_and_rental_add_up_to_the_usage_api_and_invoice(
    client: TestClient, seeded: World
) -> None:
    headers = bearer(seeded.acme.key)
    base = f"/v1/customers/{seeded.acme.customer['id']}"
    api = client.get(f"{base}/costs?period={PERIOD}", headers=headers).json()
    usage = client.get(f"{base}/usage?period={PERIOD}", headers=headers).json()
    days = api["days"]
    assert len(days) == 31 and days[9]["day"] == "2026-10-10"
    assert sum(Decimal(d["net"]) for d in days) == Decimal(usage["cost_to_date"])
    for d in days:
        assert Decimal(d["charged"]) + Decimal(d["cap"]) + Decimal(d["credited"]) == Decimal(
            d["net"]
        )
    assert api["net"] == usage["cost_to_date"]
    buckets = usage["buckets_s"]
    assert sum(d["billed_s"] for d in days) == buckets["billable"] + buckets["degraded"]
    assert sum(d["credited_s"] for d in days) == (
        buckets["failure_credit"] + buckets["migration_credit"]
    )
    assert sum(d["idle_s"] for d in days) == usage["effective"]["idle_s"]
    # The failure (10 Oct, Berlin) is credited on that day only.
    assert [d["day"] for d in days if d["credited_s"]] == ["2026-10-10"]
    assert days[9]["credited"] == "-1.97"
    [rental] = api["groups"]
    assert rental["label"] == "1 \u00d7 H100, 2026-10-10 02:00 to 2026-10-12 02:00 CEST"
    lines: dict[str, Decimal] = {}
    for line in seeded.invoice["lines"]:
        if line["rental_id"] == rental["key"]:
            lines[line["kind"]] = lines.get(line["kind"], Decimal(0)) + Decimal(line["amount"])
    assert {k: Decimal(v) for k, v in rental["by_kind"].items()} == lines
    html = client.get(f"/dashboard/costs?period={PERIOD}", headers=headers).text
    assert raw(html, "net") == api["net"]
    shown = re.findall(r'data-label="Credits" data-raw="([^"]*)"', html)
    assert sum(Decimal(x) for x in shown) == Decimal("-1.97")
    assert html.count('class="day"') == 31


def test_costs_of_an_open_month_add_up_to_the_usage_api(
    app: FastAPI, client: TestClient, seeded: World
) -> None:
    """Mid-month: the closed days come from their rollups and the open day (the failure's, 10
    Oct in Berlin) is rated live; the days still add up to the usage API's cost to date."""
    app.dependency_overrides[clock] = lambda: datetime(2026, 10, 10, 13, 0, tzinfo=UTC)
    try:
        headers = bearer(seeded.acme.key)
        base = f"/v1/customers/{seeded.acme.customer['id']}"
        api = client.get(f"{base}/costs?period={PERIOD}", headers=headers).json()
        usage = client.get(f"{base}/usage?period={PERIOD}", headers=headers).json()
    finally:
        app.dependency_overrides.pop(clock)
    days = api["days"]
    assert [d["day"] for d in days][-2:] == ["2026-10-09", "2026-10-10"]
    assert api["net"] == usage["cost_to_date"]
    assert sum(Decimal(d["net"]) for d in days) == Decimal(usage["cost_to_date"])
    buckets = usage["buckets_s"]
    assert sum(d["billed_s"] for d in days) == buckets["billable"] + buckets["degraded"]
    assert [d["credited_s"] for d in days if d["credited_s"]] == [
        buckets["failure_credit"] + buckets["migration_credit"]
    ]
    assert days[-1]["credited_s"] and Decimal(days[-1]["credited"]) < 0
    assert sum(d["idle_s"] for d in days) == usage["effective"]["idle_s"]


def test_fleet_and_revenue_for_operators_equal_their_apis(
    app: FastAPI, client: TestClient, admin_key: str, seeded: World
) -> None:
    headers = bearer(admin_key)
    # The day after the failure: it is within the last 24 hours.
    app.dependency_overrides[clock] = lambda: datetime(2026, 10, 11, 0, 0, tzinfo=UTC)
    try:
        fleet = client.get("/v1/fleet/summary", headers=headers).json()
        html = client.get("/dashboard/fleet", headers=headers).text
        revenue_html = client.get("/dashboard/revenue", headers=headers).text
    finally:
        app.dependency_overrides.pop(clock)
    [group] = fleet["groups"]
    assert (group["model"], group["gpus"], group["failures_24h"]) == ("H100", 3, 1)
    # One spare target, the failover policy's: the groups show the spare pool's figures.
    [pool] = fleet["spare_pools"]
    assert (group["spare_ready"], group["spare_target"]) == (pool["available"], pool["target"])
    assert f'data-raw="{pool["available"]}/{pool["target"]}"' in html
    [failure] = fleet["failures_24h"]
    assert failure["gpu_uuid"] == "GPU-A-1" and failure["moved_to_gpu"] == "GPU-A-2"
    assert failure["resumed_after_s"] == 47 * 60 + 30
    assert failure["cause"] == "XID 79: GPU has fallen off the bus"
    assert fleet["resumed_after"] == {"count": 1, "median_s": 2850.0, "max_s": 2850}
    assert f'data-raw="{group["gpus"]}"' in html and "47 min 30 s" in html
    # Detection is the failovers' measure (the slowest site's p50), never "unknown".
    sites = fleet["failover_latency"]
    slowest = max(s["detection"]["p50_s"] for s in sites if s["detection"]["count"])
    assert f'data-api="detection.p50_s" data-raw="{slowest}"' in html and ">unknown<" not in html
    revenue = client.get("/v1/revenue?first=2026-10&last=2026-10", headers=headers).json()
    [october] = revenue["months"]
    invoice = seeded.invoice
    assert october["total"] == invoice["total"] and october["invoices"] == 1
    credits = sum(
        Decimal(line["amount"])
        for line in invoice["lines"]
        if line["kind"] in ("failure_credit", "migration_credit")
    )
    assert Decimal(october["credited"]) == credits
    # Money on the page is written with its currency: "€117.55", never "117.55" bare.
    total = Decimal(october["total"])
    assert f'data-raw="{october["total"]}">\u20ac{total:,.2f}</td>' in revenue_html
    customer = bearer(seeded.acme.key)
    fleet_page = client.get("/dashboard/fleet", headers=customer, follow_redirects=False)
    assert fleet_page.status_code == 303
    assert client.get("/v1/revenue", headers=customer).status_code == 403


def capped_customer(console: Console) -> tuple[str, str]:
    """Customer "Capped": one H100 at 2.49/h with a 10.00 monthly cap per GPU, used on 1 and 2
    October; its id and a key."""
    prices = [
        {
            "gpu_model": "H100",
            "price_per_hour": "2.49",
            "monthly_cap_per_gpu": "10.00",
            "effective_from": "2026-01-01T00:00:00Z",
        }
    ]
    plan = console.post("/v1/plans", {"name": "capped", "prices": prices})
    registered = console.node("node-cap")
    console.gpu(registered["node"]["id"], "GPU-C-1")
    customer = console.customer("Capped")
    rental = console.rental(customer["id"], plan["id"], start_at="2026-10-01T00:00:00Z")
    console.assign(rental["id"], "GPU-C-1", "2026-10-01T00:00:00Z")
    records = world._minutes("GPU-C-1", ts("2026-10-01T00:00:00Z"), ts("2026-10-03T00:00:00Z"))
    world._ingest(console.client, registered["token"]["key"], records, [])
    key = console.post(f"/v1/customers/{customer['id']}/keys", {"name": "cap"})["key"]
    return customer["id"], key


def test_the_forecast_says_when_it_is_the_cap(
    app: FastAPI, client: TestClient, console: Console
) -> None:
    # 2.49/h with a 10.00 monthly cap per GPU, two days of October used: the allowance to date
    # is 10.00 x 2/31 = 0.65 (rounded), plus 10.00 x 29/31 for the days left = 10.0048 ->
    # 10.00, far below the uncapped 119.52 + 2.49 x 24 x 29: the forecast is the cap, and the
    # page says so.
    customer_id, key = capped_customer(console)
    app.dependency_overrides[clock] = lambda: datetime(2026, 10, 3, 0, 0, tzinfo=UTC)
    try:
        api = client.get(
            f"/v1/customers/{customer_id}/usage?period={PERIOD}", headers=bearer(key)
        ).json()
        html = client.get(f"/dashboard?period={PERIOD}", headers=bearer(key)).text
    finally:
        app.dependency_overrides.pop(clock)
    assert (api["forecast"], api["forecast_is_cap"]) == ("10.00", True)
    assert api["rentals"][0]["forecast_is_cap"] is True
    assert raw(html, "forecast") == "10.00"
    assert "The cap: every rental is forecast to reach its monthly cap" in html
    assert "(the cap)" in html


def test_an_uncapped_forecast_does_not_say_cap(
    app: FastAPI, client: TestClient, seeded: World
) -> None:
    app.dependency_overrides[clock] = lambda: datetime(2026, 10, 11, 0, 0, tzinfo=UTC)
    try:
        html = client.get(f"/dashboard?period={PERIOD}", headers=bearer(seeded.acme.key)).text
    finally:
        app.dependency_overrides.pop(clock)
    assert raw(html, "forecast") and "forecast-cap" not in html


def test_costs_group_by_model_and_datacenter_and_a_range_of_days(
    client: TestClient, console: Console, seeded: World
) -> None:
    headers = bearer(seeded.acme.key)
    base = f"/v1/customers/{seeded.acme.customer['id']}/costs"
    month = client.get(f"{base}?period={PERIOD}", headers=headers).json()
    assert month["group_by"] == "rental" and (month["start"], month["end"]) == (
        "2026-10-01",
        "2026-10-31",
    )
    for group_by, key in (("gpu_model", "H100"), ("datacenter", "fra1")):
        api = client.get(f"{base}?period={PERIOD}&group_by={group_by}", headers=headers).json()
        assert [(g["key"], g["net"]) for g in api["groups"]] == [(key, month["net"])]
        assert [d["by_group"] for d in api["days"]] == [
            {key: d["net"]} if d["by_group"] else {} for d in month["days"]
        ]
    # A range inside the month: exactly those days, and their sum.
    one = client.get(f"{base}?start=2026-10-10&end=2026-10-11", headers=headers).json()
    assert one["period"] is None and [d["day"] for d in one["days"]] == ["2026-10-10", "2026-10-11"]
    assert one["days"] == month["days"][9:11]
    assert Decimal(one["net"]) == sum(Decimal(d["net"]) for d in month["days"][9:11])
    # A range across two months rates both.
    across = client.get(f"{base}?start=2026-09-25&end=2026-10-10", headers=headers).json()
    assert len(across["days"]) == 16 and across["days"][-1] == month["days"][9]
    # Nothing in September: the range's net is 10 October's.
    assert across["days"][0]["net"] == "0.00" and across["net"] == month["days"][9]["net"]


@pytest.mark.parametrize(
    ("query", "says"),
    [
        ("start=2026-10-12&end=2026-10-01", "start 2026-10-12 is after end 2026-10-01"),
        ("start=2026-01-01&end=2026-10-01", "a range is at most 92 days"),
        ("start=2026-10-01", "a range needs both start and end"),
        ("period=2026-10&start=2026-10-01&end=2026-10-02", "either period or start and end"),
        ("start=2026-02-30&end=2026-03-01", "valid date"),
        ("start=2099-01-01&end=2099-01-02", "start 2099-01-01 is after today"),
        ("group_by=colour", "'rental', 'gpu_model' or 'datacenter'"),
    ],
)
def test_a_bad_cost_range_is_a_clear_422(
    client: TestClient, seeded: World, query: str, says: str
) -> None:
    headers = bearer(seeded.acme.key)
    api = client.get(f"/v1/customers/{seeded.acme.customer['id']}/costs?{query}", headers=headers)
    assert api.status_code == 422 and says in api.text, api.text
    page = client.get(f"/dashboard/costs?{query}", headers=headers)
    assert page.status_code == 422 and page.headers["content-type"].startswith("text/html")
    assert says.replace("'", "&#39;") in page.text, page.text


def test_costs_by_datacenter_split_a_rental_that_moved(
    client: TestClient, console: Console
) -> None:
    """A rental moved from a GPU in fra1 to one in ams1 at noon (UTC) on 11 Oct: by datacenter,
    each day's money goes where its GPU seconds were, and the groups add up to the rental."""
    plan = console.plan("dc-plan", price="3.60", currency="EUR")
    fra = console.node("node-dc-fra")
    ams = console.post("/v1/nodes", {"hostname": "node-dc-ams", "datacenter": "ams1"})
    console.gpu(fra["node"]["id"], "GPU-F-1")
    console.gpu(ams["node"]["id"], "GPU-M-1")
    tenant = world._tenant(console, "Mover", plan["id"], ["GPU-F-1", "GPU-M-1"], currency="EUR")
    moved = "2026-10-11T12:00:00Z"
    console.post(
        f"/v1/rentals/{tenant.rental['id']}/migrations",
        {
            "from_gpu_uuid": "GPU-F-1",
            "to_gpu_uuid": "GPU-M-1",
            "failed_at": moved,
            "resumed_at": moved,
        },
    )
    world._ingest(
        console.client,
        fra["token"]["key"],
        world._minutes("GPU-F-1", ts(world.START), ts(moved)),
        [],
    )
    world._ingest(
        console.client, ams["token"]["key"], world._minutes("GPU-M-1", ts(moved), ts(world.END)), []
    )
    api = client.get(
        f"/v1/customers/{tenant.customer['id']}/costs?period={PERIOD}&group_by=datacenter",
        headers=bearer(tenant.key),
    ).json()
    nets = {g["key"]: Decimal(g["net"]) for g in api["groups"]}
    # 36 h in fra1 and 12 h in ams1 at 3.60/h.
    assert nets == {"fra1": Decimal("129.60"), "ams1": Decimal("43.20")}
    assert sum(nets.values()) == Decimal(api["net"])
    for d in api["days"]:
        assert sum(Decimal(v) for v in d["by_group"].values()) == Decimal(d["net"])


def test_the_root_sends_a_person_to_the_dashboard(client: TestClient) -> None:
    response = client.get("/", follow_redirects=False)
    assert response.status_code == 307 and response.headers["location"] == "/dashboard"
    assert response.headers["link"] == '</docs>; rel="help"'
    # Followed, a signed-out person lands on the sign-in form.
    assert client.get("/").url.path == "/dashboard/sign-in"


def test_costs_show_the_cap_in_its_own_labelled_column(
    app: FastAPI, client: TestClient, console: Console
) -> None:
    """The cap's reduction is not hidden in the days' charges: its own column, named."""
    customer_id, key = capped_customer(console)
    app.dependency_overrides[clock] = lambda: datetime(2026, 10, 3, 0, 0, tzinfo=UTC)
    try:
        api = client.get(f"/v1/customers/{customer_id}/costs", headers=bearer(key)).json()
        usage = client.get(f"/v1/customers/{customer_id}/usage", headers=bearer(key)).json()
        html = client.get("/dashboard/costs", headers=bearer(key)).text
    finally:
        app.dependency_overrides.pop(clock)
    used = [d for d in api["days"] if d["billed_s"]]
    assert [d["day"] for d in used] == ["2026-10-01", "2026-10-02"]
    # 24 h x 2.49 = 59.76 charged a day; the allowance to date is 0.65: the cap takes the rest.
    assert [d["charged"] for d in used] == ["59.76", "59.76"]
    assert sum(Decimal(d["cap"]) for d in used) == Decimal("0.65") - Decimal("119.52")
    assert api["net"] == usage["cost_to_date"] == "0.65"
    assert '<th scope="col" class="num">Monthly cap</th>' in html
    shown = re.findall(r'data-label="Monthly cap" data-raw="([^"]*)"', html)
    assert shown == [d["cap"] for d in used]
    assert "Monthly cap: a price plan's monthly cap per GPU lowers a rental's charges" in html


def test_a_failover_in_progress_reads_as_such(client: TestClient, console: Console) -> None:
    """GPU-S-1 fails; the service reserves spare GPU-S-2 and asks the orchestrator, which has
    not answered: the incident says a failover is moving the job, not "not moved"."""
    plan = console.plan("failover-plan", price="2.00", currency="EUR")
    registered = console.node("node-fo")
    console.gpu(registered["node"]["id"], "GPU-S-1")
    console.gpu(registered["node"]["id"], "GPU-S-2", pool="spare")
    tenant = world._tenant(console, "Failing", plan["id"], ["GPU-S-1"], currency="EUR")
    failed = ts(world.FAILED_AT)
    records = [
        *world._minutes("GPU-S-1", ts(world.START), failed),
        *world._minutes("GPU-S-1", failed, ts(world.MIGRATED_AT), "failed"),
    ]
    token = registered["token"]["key"]
    world._ingest(console.client, token, records, world._failure_events("GPU-S-1"))
    headers = bearer(tenant.key)
    api = client.get(
        f"/v1/customers/{tenant.customer['id']}/incidents?period={PERIOD}", headers=headers
    ).json()
    [incident] = api["items"]
    assert incident["outcome"] == "moving" and incident["failover"]["state"] == "requested"
    assert "Failover in progress: moving to spare GPU GPU-S-2" in incident["summary"]
    assert "not moved" not in incident["summary"].lower()
    # The seed sends October's history in December: the steps say the failure was learned of
    # later, with no "after 57 d" that would read as the service's reaction time.
    steps = {s["step"]: s for s in incident["failover"]["steps"]}
    assert steps["detected"]["text"] == "we learned of it later, from the node's records"
    assert steps["detected"]["after"] is None and steps["detected"]["after_s"] > 86_400
    html = client.get(f"/dashboard/incidents?period={PERIOD}", headers=headers).text
    assert 'data-outcome="moving"' in html and "<strong>In progress</strong>" in html


def test_an_admin_explores_a_customers_costs_and_stays_on_that_customer(
    client: TestClient, admin_key: str, seeded: World
) -> None:
    customer = seeded.acme.customer["id"]
    query = f"customer={customer}&start=2026-10-09&end=2026-10-12&group_by=gpu_model"
    html = client.get(f"/dashboard/costs?{query}", headers=bearer(admin_key)).text
    assert f'<input type="hidden" name="customer" value="{customer}">' in html
    # The group-by links keep the customer and the range.
    assert (
        f"/dashboard/costs?customer={customer}&amp;group_by=datacenter&amp;start=2026-10-09" in html
    )
    assert 'data-group="H100"' in html


def test_every_page_calls_a_rental_by_its_name_else_by_its_gpus_and_dates(
    client: TestClient, seeded: World
) -> None:
    headers = bearer(seeded.acme.key)
    rental = seeded.acme.rental["id"]
    base = f"/v1/customers/{seeded.acme.customer['id']}"
    budget = {"amount": "1.00", "rental_id": rental, "thresholds": [{"percent": 50}]}
    assert client.post(f"{base}/budgets", json=budget, headers=headers).status_code == 201
    described = "1 \u00d7 H100, 2026-10-10 02:00 to 2026-10-12 02:00 CEST"
    named = "R&D <sweep> 7"
    for name, label in [(None, described), (named, named)]:
        renamed = client.patch(f"/v1/rentals/{rental}", json={"name": name}, headers=headers)
        assert renamed.status_code == 200, renamed.text
        costs = client.get(f"{base}/costs?period={PERIOD}", headers=headers).json()
        assert [g["label"] for g in costs["groups"]] == [label]
        incidents = client.get(f"{base}/incidents?period={PERIOD}", headers=headers).json()
        assert [i["rental_name"] for i in incidents["items"]] == [label]
        shown = html_escape(label, quote=False)
        link = f'title="Rental {rental}">{shown}</a>'
        overview = client.get(f"/dashboard?period={PERIOD}", headers=headers).text
        # The rentals table and the latest events (the failure and its XID).
        assert overview.count(link) == 3
        assert f"monthly budget for rental {shown}:" in overview
        assert f"{rental[:8]}\u2026" not in overview
        page = client.get(f"/dashboard/rentals/{rental}?period={PERIOD}", headers=headers).text
        assert f"<title>Rental {shown}" in page and f"<h1>{shown}</h1>" in page
        for path in ("/dashboard/costs", "/dashboard/incidents"):
            assert link in client.get(f"{path}?period={PERIOD}", headers=headers).text, path


def test_an_open_months_costs_page_rates_the_month_once(
    app: FastAPI, client: TestClient, seeded: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Other's October has no invoice yet: the page's path to the amount due is previewed
    from the rentals the costs rated, not from a second rating; it is still the API's."""
    rated: list[int] = []
    real = rollups.rated_to_date

    def counted(*args: Any, **kwargs: Any) -> rollups.ToDate:
        rated.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(rollups, "rated_to_date", counted)
    app.dependency_overrides[clock] = lambda: datetime(2026, 10, 10, 13, 0, tzinfo=UTC)
    try:
        headers = bearer(seeded.other.key)
        html = client.get(f"/dashboard/costs?period={PERIOD}", headers=headers).text
        page_ratings = len(rated)
        base = f"/v1/customers/{seeded.other.customer['id']}"
        due = client.get(f"{base}/amount-due?period={PERIOD}", headers=headers).json()
    finally:
        app.dependency_overrides.pop(clock)
    assert page_ratings == 1
    assert due["source"] == "to_date" and Decimal(due["steps"][-1]["amount"]) > 0
    for step in due["steps"]:
        assert raw(html, f"due.steps.{step['key']}") == step["amount"], step


def test_the_forecast_counts_the_months_additions_and_says_so(
    app: FastAPI, client: TestClient, console: Console
) -> None:
    # One H100 since September; one more on 3 and on 5 October (2.49/h, open-ended). On 7 Oct
    # the pace is the second addition's 2.49/h per the 2 days since the first; kept up over the
    # 25 days left (pace x R^2 / 2) it adds 2.49 x 24 x 25 x 25 / (2 x 2) = 9,337.50.
    plan = console.plan("growing", price="2.49")
    registered = console.node("node-grow")
    customer = console.customer("Growing")
    for gpu, start in (("G-1", "2026-09-01"), ("G-2", "2026-10-03"), ("G-3", "2026-10-05")):
        console.gpu(registered["node"]["id"], gpu)
        rental = console.rental(customer["id"], plan["id"], start_at=f"{start}T00:00:00Z")
        console.assign(rental["id"], gpu, f"{start}T00:00:00Z")
    key = console.post(f"/v1/customers/{customer['id']}/keys", {"name": "grow"})["key"]
    app.dependency_overrides[clock] = lambda: datetime(2026, 10, 7, 0, 0, tzinfo=UTC)
    try:
        api = client.get(f"/v1/customers/{customer['id']}/usage", headers=bearer(key)).json()
        html = client.get("/dashboard", headers=bearer(key)).text
    finally:
        app.dependency_overrides.pop(clock)
    assert api["forecast_new_rentals"] == "9337.50"
    # No telemetry: nothing billed so far; the three running GPUs cost 25 days x 24 h x 2.49.
    running = sum(Decimal(r["forecast"]) for r in api["rentals"])
    assert running == 3 * 25 * 24 * Decimal("2.49")
    assert Decimal(api["forecast"]) == running + Decimal("9337.50")
    assert raw(html, "forecast_new_rentals") == "9337.50"
    assert "for new rentals at this month" in html
