"""The failure loop end to end, in real processes: a rented GPU fails on a real agent, the
service (with its job-queue worker) requests a failover to the spare as a signed webhook, the
orchestrator answers "resumed", and the rental's invoice credits exactly the seconds from the
first failed second to the resumption, in cents. Then the rental page's failover timeline and
the fleet page's spare pool, in Chromium at laptop and phone widths, show the API's numbers."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

import pytest
from playwright.sync_api import Browser, expect, sync_playwright

from app.core.console_client import Api
from app.core.epoch import epoch, from_epoch
from app.core.processes import stop_child
from app.demo.orchestrator import Orchestrator
from metering_agent.nvml.simulated import DEFAULT_MODEL, sim_uuid
from tests.dashboard.test_browser import ARGS, CHROMIUM, SIZES, shoot
from tests.e2e.conftest import Fleet
from tests.harness import wait_for

pytestmark = pytest.mark.e2e

NODE = "fo-node"
PRICE = "36.00"  # per GPU-hour: one cent a second, so credited cents = credited seconds
PREEMPTIBLE_PRICE = "18.00"
RESUME_AFTER_S = 3
FAULT_AT_S = 4
PAGE_FIELDS = {"spare_gpus", "available", "reserved", "target", "preemptibly_rented", "failed",
               "preemptible_gpu_hours"}  # fmt: skip
# While a preemptible rental runs, its sold seconds grow between the page's read and ours.
TIME_VARYING = {"end", "preemptible_gpu_seconds", "preemptible_gpu_hours"}


@pytest.fixture
def loop_fleet(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Fleet:
    """The fleet, its service allowed to deliver webhooks to the orchestrator on 127.0.0.1."""
    monkeypatch.setenv("GPUMETER_WEBHOOK_ALLOW_PRIVATE", "true")
    fleet: Fleet = request.getfixturevalue("fleet")
    return fleet


@pytest.fixture
def api(loop_fleet: Fleet) -> Iterator[Api]:
    client = Api(loop_fleet.service.url, loop_fleet.admin)
    yield client
    client.close()


@pytest.fixture
def orchestrator(api: Api) -> Iterator[Orchestrator]:
    orchestrator = Orchestrator(api, RESUME_AFTER_S)
    orchestrator.start()
    orchestrator.register()
    yield orchestrator
    orchestrator.stop()


@dataclass(frozen=True)
class World:
    token: str  # the node's
    customer: str
    rental: str
    rented: str  # GPU
    spare: str  # GPU
    preemptible: str  # Globex's rental of the idle spare


@pytest.fixture
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield chromium
        chromium.close()


def rent_one_gpu_with_a_spare(api: Api) -> World:
    """Node with two GPUs, both rented from now: GPU 0 by Acme AI, GPU 1 (a hot spare)
    preemptibly by Globex Research."""
    node = api.post("/v1/nodes", {"hostname": NODE, "datacenter": "e2e-1"})
    rented, spare = (sim_uuid(NODE, i, NODE) for i in range(2))
    for gpu, pool in ((rented, "rentable"), (spare, "spare")):
        body = {"uuid": gpu, "node_id": node["node"]["id"], "model": DEFAULT_MODEL, "pool": pool}
        api.post("/v1/gpus", body)
    prices = [{"gpu_model": DEFAULT_MODEL, "price_per_hour": PRICE,
               "preemptible_price_per_hour": PREEMPTIBLE_PRICE,
               "effective_from": "2026-01-01T00:00:00Z"}]  # fmt: skip
    plan = api.post("/v1/plans", {"name": "per second", "prices": prices})
    customer = api.post("/v1/customers", {"name": "Acme AI", "currency": "USD"})
    start = _iso(int(time.time()))
    rental = api.post(
        "/v1/rentals",
        {"customer_id": customer["id"], "plan_id": plan["id"], "gpu_model": DEFAULT_MODEL,
         "gpu_count": 1, "start_at": start},
    )  # fmt: skip
    api.post(f"/v1/rentals/{rental['id']}/assignments", {"gpu_uuid": rented, "start_at": start})
    globex = api.post("/v1/customers", {"name": "Globex Research"})
    spot = api.post(
        "/v1/rentals",
        {"customer_id": globex["id"], "plan_id": plan["id"], "gpu_model": DEFAULT_MODEL,
         "gpu_count": 1, "start_at": start, "preemptible": True},
    )  # fmt: skip
    api.post(f"/v1/rentals/{spot['id']}/assignments", {"gpu_uuid": spare, "start_at": start})
    return World(node["token"]["key"], customer["id"], rental["id"], rented, spare, spot["id"])


def _iso(second: int) -> str:
    return from_epoch(second).isoformat()


def _second(moment: str) -> int:
    return epoch(datetime.fromisoformat(moment))


def first_failed_second(api: Api, gpu: str, since: int) -> int:
    timeline = api.get(f"/v1/gpus/{gpu}/timeline", start=since, end=int(time.time()) + 1)
    return min(s["start_s"] for s in timeline["segments"] if s["state"] == "failed")


def test_a_failed_gpu_fails_over_to_the_spare_and_the_downtime_is_credited_exactly(
    loop_fleet: Fleet, api: Api, orchestrator: Orchestrator, browser: Browser
) -> None:
    t0 = int(time.time())
    w = rent_one_gpu_with_a_spare(api)
    # Before: the spare is idle for failovers, though Globex rents it preemptibly.
    before = check_fleet_page(browser, loop_fleet, "before", TIME_VARYING)
    assert [(p["spare_gpus"], p["available"], p["preemptibly_rented"]) for p in before] == [
        (1, 1, 1)
    ]
    agent = loop_fleet.agent(
        NODE, w.token, "--simulate", "2",
        faults=[{"at": FAULT_AT_S, "gpu": 0, "fault": "xid", "xid": 79}],
    )  # fmt: skip
    wait_for(orchestrator.resumed, "the orchestrator resumed the failover", timeout_s=120)
    (resume,) = orchestrator.resumed().values()
    (requested,) = orchestrator.events("failover.requested")
    assert requested.data["rental_id"] == w.rental and requested.data["failed_gpu_uuid"] == w.rented
    assert requested.data["spare_gpu_uuid"] == w.spare
    failed_s = first_failed_second(api, w.rented, t0)
    assert _second(requested.data["failed_at"]) == failed_s
    failover = api.get(f"/v1/failovers/{resume.failover_id}")
    assert failover["state"] == "resumed"
    assert _second(failover["resumed_at"]) == resume.resumed_at
    # The job runs on the spare now: the rental holds it, and no longer the failed GPU.
    held = [a["gpu_uuid"] for a in api.get(f"/v1/rentals/{w.rental}")["assignments"]
            if a["end_at"] is None]  # fmt: skip
    assert held == [w.spare]
    # Globex's preemptible rental of the spare ended when the failover took it.
    spot = api.get(f"/v1/rentals/{w.preemptible}")
    assert spot["preempted_at"] is not None and spot["end_at"] == spot["preempted_at"]
    sold_s = _second(spot["preempted_at"]) - _second(spot["start_at"])

    ended = resume.resumed_at + 2
    wait_for(lambda: time.time() >= ended + 1, "the rental's last second passed", timeout_s=10)
    api.post(f"/v1/rentals/{w.rental}/end", {"end_at": _iso(ended)})
    assert stop_child(agent, "agent") == 0
    api.post("/v1/invoices/runs", {"period": f"{from_epoch(ended):%Y-%m}"})
    (listed,) = api.get("/v1/invoices", customer_id=w.customer)["items"]
    invoice = api.get(f"/v1/invoices/{listed['id']}")
    credits = [line for line in invoice["lines"] if line["kind"].endswith("_credit")]
    credited_s = resume.resumed_at - failed_s
    assert sum(line["seconds"] for line in credits) == credited_s
    assert -sum(Decimal(line["amount"]) for line in credits) == Decimal(credited_s) / 100
    assert {line["gpu_uuid"] for line in credits} == {w.rented}

    check_rental_page(browser, api, loop_fleet, w, failover, credits)
    after = check_fleet_page(browser, loop_fleet, "after", {"end"})
    # The one spare now serves Acme AI: none left, below the 5 % target of 2 GPUs (1).
    assert [(p["total_gpus"], p["available"], p["target"]) for p in after] == [(2, 0, 1)]
    (site,) = api.get("/v1/failovers/summary")["sites"]
    assert site["failovers"] == 1 and site["resume"]["p50_s"] == credited_s
    assert sold_s > 0


def check_rental_page(
    browser: Browser,
    api: Api,
    fleet: Fleet,
    w: World,
    failover: dict[str, Any],
    credits: list[dict[str, Any]],
) -> None:
    link = api.post(f"/v1/customers/{w.customer}/portal-links", {})["url"]
    context = browser.new_context(base_url=fleet.service.url, viewport=SIZES["laptop"])
    page = context.new_page()
    page.goto("/dashboard/portal/" + link.rsplit("/", 1)[1])
    page.goto(f"/dashboard/rentals/{w.rental}")
    timeline = page.locator(f'[data-failover="{failover["id"]}"]')
    expect(timeline).to_be_visible()
    failed = datetime.fromisoformat(failover["failed_at"])
    for step in ("failed", "detected", "requested", "resumed"):
        at = datetime.fromisoformat(failover[f"{step}_at"])
        shown = timeline.locator(f'[data-step="{step}"]')
        assert datetime.fromisoformat(shown.get_attribute("data-at") or "") == at
        after = round((at - failed).total_seconds(), 1)
        expect(shown).to_have_attribute("data-after-s", str(after))
    credited = -sum(Decimal(line["amount"]) for line in credits)
    expect(timeline.locator('[data-step="credited"]')).to_contain_text(f"{credited:.2f}")
    shoot(page, "failover-rental")
    context.close()


def check_fleet_page(
    browser: Browser, fleet: Fleet, moment: str, varying: set[str]
) -> list[dict[str, Any]]:
    """The fleet page's hot-spare rows show what the spare-pool API says (``varying``: fields
    that move with the clock between the two reads, not compared); the API's pools."""
    context = browser.new_context(base_url=fleet.service.url, viewport=SIZES["laptop"])
    page = context.new_page()
    page.goto("/dashboard/sign-in")
    page.get_by_label("API key").fill(fleet.admin)
    page.get_by_role("button", name="Sign in").click()
    page.get_by_role("link", name="Fleet").click()
    pools = context.request.get("/v1/spare-pool").json()["pools"]
    summary = context.request.get("/v1/fleet/summary").json()["spare_pools"]
    assert _without(summary, varying) == _without(pools, varying)
    for pool in pools:
        row = page.locator(f'tr[data-pool="{pool["model"]}/{pool["datacenter"]}"]')
        for field in PAGE_FIELDS - varying:
            expect(row.locator(f'[data-api="{field}"]')).to_have_attribute(
                "data-raw", str(pool[field])
            )
    for site in context.request.get("/v1/failovers/summary").json()["sites"]:
        row = page.locator(f'tr[data-site="{site["model"]}/{site["datacenter"]}"]')
        for name in ("detection", "request", "resume"):
            shown = f"{site[name]['p50_s']}/{site[name]['p99_s']}"
            expect(row.locator(f'[data-api="{name}"]')).to_have_attribute("data-raw", shown)
    shoot(page, f"failover-fleet-{moment}")
    context.close()
    return list(pools)


def _without(pools: list[dict[str, Any]], fields: set[str]) -> list[dict[str, Any]]:
    return [{k: v for k, v in p.items() if k not in fields} for p in pools]
