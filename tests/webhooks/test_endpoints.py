"""The webhook admin API: registration rules, secrets, scoping, the delivery log, re-sends."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from sqlalchemy import Engine

from app.core.db import transaction
from app.events.service import publish
from app.settings import Settings, get_settings
from app.webhooks.delivery import backoff_s
from tests.harness import Console, bearer, wait_for
from tests.webhooks.conftest import register
from tests.webhooks.receiver import Receiver


def publish_one(db: Engine, customer_id: str | None = None, type_: str = "test.happened") -> str:
    with transaction(db) as session:
        owner = uuid.UUID(customer_id) if customer_id else None
        return str(publish(session, type_, {}, subject="thing/1", customer_id=owner).id)


def log(console: Console, endpoint: dict[str, Any]) -> list[dict[str, Any]]:
    path = f"/v1/webhooks/endpoints/{endpoint['id']}/deliveries"
    response = console.client.get(path, headers=console.headers)
    assert response.status_code == 200, response.text
    return response.json()["items"]


REFUSED = "not a global unicast address"


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("ftp://example.com/hook", "URL scheme should be 'http' or 'https'"),
        ("http://127.0.0.1:8000/hook", REFUSED),
        ("http://10.1.2.3/hook", REFUSED),
        ("http://169.254.169.254/latest/meta-data", REFUSED),
        ("http://[::1]/hook", REFUSED),
        # IPv6 forms judged by the IPv4 address they embed (NAT64, 6to4, mapped, compatible)
        ("http://[64:ff9b::a9fe:a9fe]/hook", REFUSED),
        ("http://[64:ff9b::a00:1]/hook", REFUSED),
        ("http://[64:ff9b:1::808:808]/hook", REFUSED),
        ("http://[2002:7f00:1::]/hook", REFUSED),
        ("http://[::ffff:10.0.0.1]/hook", REFUSED),
        ("http://[::a9fe:a9fe]/hook", REFUSED),
        ("http://localhost/hook", REFUSED),
        # Only global unicast: SIIT's IPv4-translated and the IPv4-mapped forms, site-local,
        # multicast (IPv6 and IPv4, and an IPv4 one inside 6to4), reserved and documentation.
        ("http://[::ffff:0:808:808]/hook", REFUSED),
        ("http://[::ffff:8.8.8.8]/hook", REFUSED),
        ("http://[fec0::1]/hook", REFUSED),
        ("http://[ff0e::1]/hook", REFUSED),
        ("http://224.0.0.1/hook", REFUSED),
        ("http://233.252.0.1/hook", REFUSED),
        ("http://[2002:e000:1::]/hook", REFUSED),
        ("http://[4000::1]/hook", REFUSED),
        ("http://[5f00::1]/hook", REFUSED),
        ("http://[e000::1]/hook", REFUSED),
        ("http://[3fff::1]/hook", REFUSED),
        ("http://user:pw@example.com/hook", "credentials in the URL"),
        ("http://no-such-host.invalid/hook", "does not resolve"),
    ],
)
def test_only_public_http_targets_are_accepted(console: Console, url: str, message: str) -> None:
    response = console.client.post(
        "/v1/webhooks/endpoints", json={"url": url}, headers=console.headers
    )
    assert response.status_code == 422, response.text
    [error] = response.json()["detail"]
    assert error["loc"][:2] == ["body", "url"]
    assert message in error["msg"]


@pytest.mark.usefixtures("settings")
def test_the_secret_is_shown_on_creation_and_rotation_only(console: Console) -> None:
    created = console.post("/v1/webhooks/endpoints", {"url": "http://127.0.0.1:1/h"})
    assert created["secret"].startswith("whsec_")
    read = console.client.get(
        f"/v1/webhooks/endpoints/{created['id']}", headers=console.headers
    ).json()
    assert "secret" not in read
    listed = console.client.get("/v1/webhooks/endpoints", headers=console.headers).json()
    assert all("secret" not in item for item in listed["items"])
    rotated = console.post(f"/v1/webhooks/endpoints/{created['id']}/secret", {}, 200)
    assert rotated["secret"].startswith("whsec_") and rotated["secret"] != created["secret"]


def test_endpoints_are_for_admins_only(console: Console) -> None:
    acme = console.customer()
    key = console.post(f"/v1/customers/{acme['id']}/keys", {"name": "acme"})["key"]
    response = console.client.get("/v1/webhooks/endpoints", headers=bearer(key))
    assert response.status_code == 403


@pytest.mark.usefixtures("worker")
def test_after_rotation_both_secrets_sign_during_the_overlap(
    console: Console, db: Engine, receiver: Receiver
) -> None:
    endpoint = register(console, receiver, "/hooks")
    old = endpoint["secret"]
    new = console.post(f"/v1/webhooks/endpoints/{endpoint['id']}/secret", {}, 200)["secret"]
    receiver.secrets["/hooks"] = new  # the receiver switched: the new secret verifies
    first = publish_one(db)
    wait_for(lambda: receiver.ids("/hooks") == [first], "the delivery with the new secret")
    receiver.secrets["/hooks"] = old  # a receiver not yet switched verifies it too
    second = publish_one(db)
    wait_for(lambda: receiver.ids("/hooks") == [first, second], "the delivery with the old one")
    assert receiver.rejected == []


@pytest.mark.usefixtures("worker")
def test_endpoints_get_the_types_and_the_customer_they_asked_for(
    console: Console, db: Engine, receiver: Receiver
) -> None:
    acme, other = console.customer("Acme"), console.customer("Other")
    register(console, receiver, "/acme", customer_id=acme["id"])
    register(console, receiver, "/typed", event_types=["other.happened"])
    register(console, receiver, "/all")
    ids = [
        publish_one(db, acme["id"]),
        publish_one(db, other["id"]),
        publish_one(db, None, "other.happened"),
    ]
    wait_for(lambda: len(receiver.ids("/all")) == 3, "every event at the catch-all endpoint")
    wait_for(lambda: receiver.ids("/acme") and receiver.ids("/typed"), "the scoped deliveries")
    assert receiver.ids("/acme") == [ids[0]]
    assert receiver.ids("/typed") == [ids[2]]


def test_a_disabled_endpoint_gets_nothing_and_resend_needs_it_enabled(
    console: Console, db: Engine, receiver: Receiver, settings: Settings
) -> None:
    endpoint = register(console, receiver, "/hooks")
    publish_one(db)
    [delivery] = log(console, endpoint)
    assert (delivery["status"], delivery["attempts"], delivery["log"]) == ("pending", 0, [])
    patch = console.client.patch(
        f"/v1/webhooks/endpoints/{endpoint['id']}", json={"enabled": False}, headers=console.headers
    )
    assert patch.json()["enabled"] is False
    publish_one(db)
    assert len(log(console, endpoint)) == 1  # no delivery for an event after disabling
    resend = console.client.post(
        f"/v1/webhooks/deliveries/{delivery['id']}/resend", headers=console.headers
    )
    assert resend.status_code == 409
    assert resend.json()["detail"][0]["loc"] == ["path", "delivery_id"]


@pytest.mark.usefixtures("worker")
def test_a_failing_delivery_is_retried_logged_and_can_be_resent(
    console: Console, db: Engine, receiver: Receiver
) -> None:
    endpoint = register(console, receiver, "/hooks")
    receiver.status = 503
    event_id = publish_one(db)
    wait_for(lambda: log(console, endpoint)[0]["attempts"] >= 3, "three failed attempts")
    receiver.status = 204
    wait_for(lambda: log(console, endpoint)[0]["status"] == "succeeded", "the retry to succeed")
    [delivery] = log(console, endpoint)
    codes = [a["status_code"] for a in delivery["log"]]
    assert codes[-1] == 204 and set(codes[:-1]) == {503}
    assert [a["number"] for a in delivery["log"]] == list(range(1, len(codes) + 1))
    assert delivery["log"][0]["error"] == "HTTP 503"
    resent = console.post(f"/v1/webhooks/deliveries/{delivery['id']}/resend", {}, 200)
    assert resent["status"] == "pending"
    wait_for(lambda: receiver.ids("/hooks") == [event_id, event_id], "the re-send, same id")


def test_backoff_grows_threefold_to_its_cap_and_spans_about_three_days() -> None:
    get_settings.cache_clear()
    settings = get_settings()  # the defaults: 5 s, x3, at most 6 h, for 3 days
    delays = [backoff_s(n, settings) for n in range(1, 12)]
    assert delays[:5] == [5, 15, 45, 135, 405]
    assert delays[-1] == 6 * 3600
    elapsed, attempts = 0.0, 1
    while elapsed + backoff_s(attempts, settings) <= settings.webhook_retry_window_s:
        elapsed += backoff_s(attempts, settings)
        attempts += 1
    assert attempts == 20  # attempts before giving up, the last one 70.6 h after the first
    assert elapsed == 16_400 + 11 * 21_600
