"""The Stripe mirror against the fake Stripe, through the real SDK."""

from __future__ import annotations

import threading
import time
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
import stripe
from sqlalchemy import Engine, func, select, update

from app.billing.models import Invoice
from app.core.db import transaction
from app.customers.models import Customer
from app.payments import stripe_mirror
from app.payments.models import StripeOutbox
from app.payments.stripe_api import make_client
from app.payments.stripe_mirror import claim
from app.settings import Settings
from tests.payments.conftest import LINES, TOTAL_MINOR, Mirror, configure
from tests.payments.fake_stripe import FakeStripe


class Crash(Exception):
    """Stands for the worker process dying between two Stripe calls."""


def crash() -> None:
    raise Crash


def test_full_mirror_with_exact_amounts(mirror: Mirror, fake: FakeStripe) -> None:
    invoice_id = mirror.finalized(collection_method="send_invoice", days_until_due=14)
    assert mirror.row(invoice_id)["state"] == "pending"  # queued by the finalization itself

    assert mirror.sync() == 1

    ours = mirror.invoice(invoice_id)
    theirs = fake.invoice(ours.stripe_invoice_id)
    assert theirs["status"] == "open"
    assert theirs["amount_due"] == TOTAL_MINOR == int(ours.total * 100)
    assert (theirs["collection_method"], theirs["days_until_due"]) == ("send_invoice", 14)
    assert theirs["auto_advance"] is False
    assert theirs["metadata"]["gpumeter_invoice_id"] == str(invoice_id)
    assert (ours.stripe_invoice_number, ours.stripe_status) == (theirs["number"], "open")
    assert ours.stripe_hosted_url == theirs["hosted_invoice_url"]
    items = sorted(
        fake.items_of(theirs["id"]), key=lambda i: int(i["metadata"]["gpumeter_line_id"])
    )
    assert [i["amount"] for i in items] == [6917, -125, -500, -346, 1130]
    assert {i["currency"] for i in items} == {"usd"}
    assert items[0]["description"] == "H100 charge: 100000 GPU-s at 2.49 USD/GPU-h"
    assert items[1]["description"] == "H100 failure credit: 1807 GPU-s at 2.49 USD/GPU-h"
    assert items[4]["description"] == "tax at 19 %"
    assert [i["metadata"]["gpumeter_line_id"] for i in items] == [str(li.id) for li in ours.lines]
    row = mirror.row(invoice_id)
    assert (row["state"], row["step"], row["items_created"]) == ("synced", "finalized", len(LINES))
    with transaction(mirror.engine) as session:
        customer = session.get_one(Customer, ours.customer_id)
        assert customer.stripe_customer_id in fake.customers

    posts = len(fake.posts("/v1"))
    assert mirror.sync() == 0  # nothing due: a synced invoice is never mirrored again
    assert len(fake.posts("/v1")) == posts


def test_charge_automatically_sends_no_due_days(mirror: Mirror, fake: FakeStripe) -> None:
    invoice_id = mirror.finalized(collection_method="charge_automatically")
    mirror.sync()
    theirs = fake.invoice(mirror.invoice(invoice_id).stripe_invoice_id)
    assert (theirs["collection_method"], theirs["days_until_due"]) == ("charge_automatically", None)


def test_one_stripe_customer_per_customer(mirror: Mirror, fake: FakeStripe) -> None:
    customer_id = mirror.customer()
    first, second = mirror.draft(customer_id, "2026-10"), mirror.draft(customer_id, "2026-11")
    mirror.finalize(first)
    mirror.finalize(second)
    assert mirror.sync() == 2
    assert len(fake.customers) == 1
    assert len(fake.invoices) == 2


def test_crash_between_items_then_resume_creates_no_duplicates(
    mirror: Mirror, fake: FakeStripe
) -> None:
    invoice_id = mirror.finalized()
    created = 0

    def crash_after_two() -> None:
        nonlocal created
        created += 1
        if created == 2:
            raise Crash

    with pytest.raises(Crash):
        mirror.sync(after_item=crash_after_two)
    row = mirror.row(invoice_id)
    assert (row["state"], row["step"], row["items_created"]) == ("pending", "invoice", 2)
    assert row["lease_owner"] is not None  # the dead worker still holds it...
    assert mirror.sync() == 0  # ...so nobody else touches it until the lease runs out

    mirror.expire_leases()
    assert mirror.sync() == 1

    ours = mirror.invoice(invoice_id)
    items = fake.items_of(ours.stripe_invoice_id)
    per_line = Counter(i["metadata"]["gpumeter_line_id"] for i in items)
    assert per_line == Counter(str(line.id) for line in ours.lines)  # each line exactly once
    assert len(fake.invoices) == 1 and len(fake.customers) == 1
    assert len(fake.posts(f"/v1/invoices/{ours.stripe_invoice_id}/finalize")) == 1
    assert fake.invoice(ours.stripe_invoice_id)["amount_due"] == TOTAL_MINOR
    assert mirror.row(invoice_id)["state"] == "synced"


def test_resume_after_keys_expired_finds_objects_by_metadata(
    mirror: Mirror, fake: FakeStripe
) -> None:
    """Stripe forgets idempotency keys after 24 h; metadata still leads back to our objects."""
    invoice_id = mirror.finalized()
    with pytest.raises(Crash):
        mirror.sync(after_item=crash)
    fake._idempotency.clear()
    with mirror.engine.begin() as conn:  # as if the commits recording the ids had been lost
        conn.execute(update(Customer).values(stripe_customer_id=None))
        conn.execute(update(Invoice).values(stripe_invoice_id=None))
    mirror.expire_leases()

    assert mirror.sync() == 1

    assert len(fake.customers) == 1 and len(fake.invoices) == 1
    (stripe_invoice,) = fake.invoices.values()
    assert len(fake.items_of(stripe_invoice["id"])) == len(LINES)
    assert stripe_invoice["status"] == "open"
    assert mirror.invoice(invoice_id).stripe_invoice_id == stripe_invoice["id"]


def test_dropped_connection_is_retried_later_under_the_same_key(
    mirror: Mirror, fake: FakeStripe
) -> None:
    invoice_id = mirror.finalized()
    with fake.down("drop"):
        assert mirror.sync() == 1  # a dropped connection: retried later, not failed
    row = mirror.row(invoice_id)
    assert (row["state"], row["attempts"]) == ("pending", 1)
    assert "APIConnectionError" in row["last_error"]
    mirror.make_due()
    assert mirror.sync() == 1
    assert mirror.row(invoice_id)["state"] == "synced"
    # Stripe saw the customer create twice (first dropped unanswered), under one key.
    keys = {post.idempotency_key for post in fake.posts("/v1/customers")}
    assert keys == {f"gpumeter-customer-{mirror.invoice(invoice_id).customer_id}"}


def test_lost_answers_are_replayed_not_created_twice(mirror: Mirror, fake: FakeStripe) -> None:
    """Stripe did the work but the answer was lost, and search does not show the object yet:
    the retry's key gets Stripe's first answer instead of a second object."""
    fake.search_lags = True
    invoice_id = mirror.finalized()
    with fake.down("lose"):
        mirror.sync()  # the customer is created in Stripe; we never hear of it
    assert mirror.row(invoice_id)["state"] == "pending" and len(fake.customers) == 1
    for _ in range(len(LINES) + 3):  # every create is lost once, then replayed
        mirror.make_due()
        with fake.down("lose"):
            mirror.sync()
        mirror.make_due()
        mirror.sync()
        if mirror.row(invoice_id)["state"] == "synced":
            break
    assert mirror.row(invoice_id)["state"] == "synced"
    assert (len(fake.customers), len(fake.invoices), len(fake.items)) == (1, 1, len(LINES))
    per_key = Counter(p.idempotency_key for p in fake.posts("/v1/"))
    customer_id = mirror.invoice(invoice_id).customer_id
    assert per_key[f"gpumeter-customer-{customer_id}"] >= 2  # lost, then replayed


class FrozenClock:
    """A clock that moves only when told to."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@pytest.mark.e2e
def test_stripe_outage_then_recovery(
    mirror: Mirror, fake: FakeStripe, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stripe goes down mid-invoice for 8 s: finalization is never blocked, the sync backs
    off, and after recovery it completes with every retried call under its first key."""
    mirror.settings = configure(
        monkeypatch, stripe_retry_base_s=0.25, stripe_retry_max_s=2, stripe_max_network_retries=1
    )
    mirror.client = make_client(mirror.settings)
    first = mirror.finalized()
    created = 0

    def outage_after_two() -> None:
        nonlocal created
        created += 1
        if created == 2:
            fake.outage = "503"

    # The backoff runs on the mirror's clock, which moves 0.2 s a poll: the attempts made in
    # the 8 s do not depend on how long each poll took.
    clock = FrozenClock(datetime.now(UTC))
    monkeypatch.setattr(stripe_mirror, "_now", clock)
    mirror.sync(after_item=outage_after_two)
    second = mirror.finalized()  # finalizing during the outage still commits and queues
    for _ in range(40):
        clock.advance(0.2)
        mirror.sync()
    rows = [mirror.row(first), mirror.row(second)]
    # Backoff 0.25, 0.5, 1, 2, 2 ... s: a handful of attempts in 8 s, not one per poll.
    assert all(r["state"] == "pending" and 3 <= r["attempts"] <= 8 for r in rows), rows
    assert all("Service unavailable" in r["last_error"] for r in rows)

    fake.outage = None
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(
        mirror.row(i)["state"] != "synced" for i in (first, second)
    ):
        clock.advance(0.2)
        mirror.sync()
    for invoice_id in (first, second):
        assert mirror.row(invoice_id)["state"] == "synced"
        stripe_id = mirror.invoice(invoice_id).stripe_invoice_id
        assert fake.invoice(stripe_id)["amount_due"] == TOTAL_MINOR
        assert len(fake.items_of(stripe_id)) == len(LINES)
    third_line = [p for p in fake.posts("/v1/invoiceitems") if p.status == 503]
    assert len(third_line) >= 2  # the SDK's retry of the same call during the outage...
    assert len({p.idempotency_key for p in third_line}) == 1  # ...under one key
    replayed = [
        p
        for p in fake.posts("/v1/invoiceitems")
        if p.idempotency_key == third_line[0].idempotency_key
    ]
    assert [p.status for p in replayed][-1] == 200


def test_amount_mismatch_stops_the_sync_and_shows_in_the_api(
    mirror: Mirror, fake: FakeStripe, console, client
) -> None:
    invoice_id = mirror.draft(mirror.customer(), total="70.75")  # lines sum to 70.76
    mirror.finalize(invoice_id)
    mirror.sync()

    row = mirror.row(invoice_id)
    assert row["state"] == "failed" and "due 7076 but our total is 7075" in row["last_error"]
    ours = mirror.invoice(invoice_id)
    assert fake.invoice(ours.stripe_invoice_id)["status"] == "draft"  # never finalized
    view = client.get(f"/v1/stripe/invoices/{invoice_id}", headers=console.headers).json()
    assert view["sync"]["state"] == "failed"
    assert "7075" in view["stripe_error"]
    failed = client.get("/v1/stripe/sync?state=failed", headers=console.headers).json()
    assert [item["invoice_id"] for item in failed["items"]] == [str(invoice_id)]
    mirror.make_due()
    assert mirror.sync() == 0  # stopped: no retry until an operator asks for one


def test_foreign_item_on_the_stripe_draft_is_an_error(mirror: Mirror, fake: FakeStripe) -> None:
    invoice_id = mirror.finalized()
    with pytest.raises(Crash):
        mirror.sync(after_item=crash)
    ours = mirror.invoice(invoice_id)
    fake.handle(  # someone adds an item to our draft in the Stripe dashboard
        "POST",
        "/v1/invoiceitems",
        {
            "customer": fake.invoice(ours.stripe_invoice_id)["customer"],
            "invoice": ours.stripe_invoice_id,
            "amount": "100",
            "currency": "usd",
        },
        {"Authorization": f"Bearer {fake.api_key}"},
    )
    mirror.expire_leases()
    mirror.sync()
    row = mirror.row(invoice_id)
    assert row["state"] == "failed" and "is not one of our lines" in row["last_error"]


def test_admin_retry_requeues_a_failed_sync(
    mirror: Mirror, fake: FakeStripe, console, client
) -> None:
    invoice_id = mirror.finalized()
    fake.api_key = "sk_test_rotated"  # our key is refused: a permanent error
    mirror.sync()
    assert mirror.row(invoice_id)["state"] == "failed"
    fake.api_key = mirror.settings.stripe_api_key or ""
    response = client.post(f"/v1/stripe/invoices/{invoice_id}/retry", headers=console.headers)
    assert response.status_code == 200, response.text
    assert response.json()["state"] == "pending"
    assert mirror.sync() == 1
    assert mirror.row(invoice_id)["state"] == "synced"
    again = client.post(f"/v1/stripe/invoices/{invoice_id}/retry", headers=console.headers)
    assert again.status_code == 409


def test_void_after_mirror_voids_the_stripe_invoice(mirror: Mirror, fake: FakeStripe) -> None:
    invoice_id = mirror.finalized()
    mirror.sync()
    mirror.void(invoice_id)
    assert mirror.row(invoice_id)["target"] == "void"
    assert mirror.sync() == 1
    ours = mirror.invoice(invoice_id)
    assert fake.invoice(ours.stripe_invoice_id)["status"] == "void" == ours.stripe_status
    assert mirror.row(invoice_id)["step"] == "voided"
    assert [
        p.idempotency_key for p in fake.posts(f"/v1/invoices/{ours.stripe_invoice_id}/void")
    ] == [f"gpumeter-invoice-{invoice_id}-void"]


def test_void_before_the_mirror_finished_deletes_the_draft(
    mirror: Mirror, fake: FakeStripe
) -> None:
    invoice_id = mirror.finalized()
    with pytest.raises(Crash):
        mirror.sync(after_item=crash)
    mirror.void(invoice_id)
    mirror.expire_leases()
    assert mirror.sync() == 1
    assert fake.invoices == {}  # the draft is gone, not finalized then voided
    assert mirror.invoice(invoice_id).stripe_status == "deleted"


def test_void_before_any_sync_touches_nothing_in_stripe(mirror: Mirror, fake: FakeStripe) -> None:
    invoice_id = mirror.finalized()
    mirror.void(invoice_id)
    assert mirror.sync() == 1
    assert fake.invoices == {} and fake.posts("/v1/invoices") == []
    assert mirror.row(invoice_id)["state"] == "synced"


def test_without_a_stripe_key_nothing_is_queued(
    db: Engine, monkeypatch: pytest.MonkeyPatch, settings: Settings, fake: FakeStripe
) -> None:
    monkeypatch.delenv("GPUMETER_STRIPE_API_KEY")
    configure(monkeypatch)
    Mirror(db, settings, None).finalized()  # type: ignore[arg-type]
    with transaction(db) as session:
        assert session.scalar(select(func.count()).select_from(StripeOutbox)) == 0
    assert fake.log == []


def test_two_workers_never_hold_one_invoice(mirror: Mirror, settings: Settings) -> None:
    mirror.finalized()
    first = claim(mirror.engine, settings, "worker-a")
    assert first is not None
    assert claim(mirror.engine, settings, "worker-b") is None


def test_sdk_retries_share_the_key(
    mirror: Mirror, fake: FakeStripe, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With SDK retries on, one call retried after a 503 carries one key and creates once."""
    settings = configure(monkeypatch, stripe_max_network_retries=2)
    client = make_client(settings)
    fake.outage = "503"
    timer = threading.Timer(0.3, lambda: setattr(fake, "outage", None))
    timer.start()
    created = client.v1.customers.create({"name": "x"}, {"idempotency_key": "k-1"})
    timer.join()
    attempts = fake.posts("/v1/customers")
    assert len(attempts) >= 2 and {a.idempotency_key for a in attempts} == {"k-1"}
    assert list(fake.customers) == [created.id]


def test_fake_refuses_a_reused_key_with_other_parameters(
    stripe_client: stripe.StripeClient,
) -> None:
    first = stripe_client.v1.customers.create({"name": "a"}, {"idempotency_key": "same"})
    replay = stripe_client.v1.customers.create({"name": "a"}, {"idempotency_key": "same"})
    assert replay.id == first.id
    with pytest.raises(stripe.IdempotencyError):
        stripe_client.v1.customers.create({"name": "b"}, {"idempotency_key": "same"})
