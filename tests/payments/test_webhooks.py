"""POST /v1/stripe/webhook: signatures, the inbox, and each handled event's effect."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import stripe
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from app.billing.models import InvoiceStatus
from app.core.db import transaction
from app.payments.models import PaymentFailure, StripeWebhookEvent
from tests.harness import Console
from tests.payments.conftest import (
    TOTAL_MINOR,
    WEBHOOK_SECRET,
    Mirror,
    configure,
    event,
    signed,
)
from tests.payments.fake_stripe import FakeStripe

WEBHOOK = "/v1/stripe/webhook"


def deliver(client: TestClient, evt: dict[str, Any], timestamp: int | None = None) -> Any:
    payload, headers = signed(evt, timestamp)
    return client.post(WEBHOOK, content=payload, headers=headers)


def mirrored(mirror: Mirror, fake: FakeStripe) -> tuple[uuid.UUID, dict[str, Any]]:
    invoice_id = mirror.finalized()
    mirror.sync()
    return invoice_id, fake.invoice(mirror.invoice(invoice_id).stripe_invoice_id)


def count(mirror: Mirror, model: type) -> int:
    with transaction(mirror.engine) as session:
        return session.scalar(select(func.count()).select_from(model)) or 0


def test_valid_signature_is_accepted_and_stored(mirror: Mirror, client: TestClient) -> None:
    evt = event("customer.created", {"id": "cus_x", "object": "customer"})
    response = deliver(client, evt)
    assert response.status_code == 200, response.text
    assert response.json() == {"event_id": evt["id"], "duplicate": False}
    with transaction(mirror.engine) as session:
        assert session.get_one(StripeWebhookEvent, evt["id"]).outcome == "ignored"


@pytest.mark.parametrize(
    "tamper",
    [
        pytest.param(
            lambda h: h | {"Stripe-Signature": h["Stripe-Signature"][:-2] + "00"}, id="wrong-hmac"
        ),
        pytest.param(
            lambda h: {k: v for k, v in h.items() if k != "Stripe-Signature"}, id="missing"
        ),
        pytest.param(lambda h: h | {"Stripe-Signature": "garbage"}, id="malformed"),
    ],
)
def test_invalid_signature_is_rejected(mirror: Mirror, client: TestClient, tamper: Any) -> None:
    payload, headers = signed(event("invoice.paid", {"id": "in_x", "object": "invoice"}))
    response = client.post(WEBHOOK, content=payload, headers=tamper(headers))
    assert response.status_code == 400, response.text
    assert response.json()["detail"][0]["type"] == "invalid_signature"
    assert count(mirror, StripeWebhookEvent) == 0


def test_body_changed_after_signing_is_rejected(mirror: Mirror, client: TestClient) -> None:
    payload, headers = signed(event("invoice.paid", {"id": "in_x", "object": "invoice"}))
    response = client.post(WEBHOOK, content=payload.replace("in_x", "in_y"), headers=headers)
    assert response.status_code == 400


def test_stale_signature_is_rejected(mirror: Mirror, client: TestClient) -> None:
    evt = event("invoice.paid", {"id": "in_x", "object": "invoice"})
    assert deliver(client, evt, timestamp=int(time.time()) - 301).status_code == 400
    assert deliver(client, evt, timestamp=int(time.time()) - 200).status_code == 200


def test_webhook_is_off_without_a_secret(
    mirror: Mirror, client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GPUMETER_STRIPE_WEBHOOK_SECRET")
    configure(monkeypatch)
    response = deliver(client, event("invoice.paid", {"id": "in_x", "object": "invoice"}))
    assert response.status_code == 400
    assert "no Stripe webhook secret" in response.json()["detail"][0]["msg"]


def test_paid_reaches_our_invoice(
    mirror: Mirror, fake: FakeStripe, client: TestClient, console: Console
) -> None:
    invoice_id, theirs = mirrored(mirror, fake)
    paid = fake.set_status(theirs["id"], "paid") | {"amount_paid": TOTAL_MINOR}
    response = deliver(client, event("invoice.paid", paid))
    assert response.status_code == 200, response.text

    ours = mirror.invoice(invoice_id)
    assert (ours.status, ours.stripe_status) == (InvoiceStatus.PAID, "paid")
    assert ours.paid_at is not None
    view = client.get(f"/v1/stripe/invoices/{invoice_id}", headers=console.headers).json()
    assert view["stripe_status"] == "paid"


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (
            {"amount_paid": TOTAL_MINOR - 1},
            f"{TOTAL_MINOR - 1} paid (minor units), but the invoice's total is {TOTAL_MINOR}",
        ),
        ({"currency": "eur"}, "paid in EUR, but the invoice is in USD"),
        ({"livemode": True}, "paid in Stripe's live mode, but our key is for test"),
    ],
    ids=["amount", "currency", "livemode"],
)
def test_a_payment_that_does_not_match_our_invoice_is_recorded_not_applied(
    mirror: Mirror, fake: FakeStripe, client: TestClient, change: dict[str, Any], reason: str
) -> None:
    invoice_id, theirs = mirrored(mirror, fake)
    paid = fake.set_status(theirs["id"], "paid") | {"amount_paid": TOTAL_MINOR} | change
    evt = event("invoice.paid", paid)
    response = deliver(client, evt)
    assert response.status_code == 200, response.text

    ours = mirror.invoice(invoice_id)
    assert (ours.status, ours.paid_at) == (InvoiceStatus.FINALIZED, None)
    assert ours.stripe_error == f"invoice.paid {evt['id']} not applied: {reason}"
    with transaction(mirror.engine) as session:
        assert session.get_one(StripeWebhookEvent, evt["id"]).outcome == "mismatch"


def test_duplicate_delivery_is_a_no_op(
    mirror: Mirror, fake: FakeStripe, client: TestClient, console: Console
) -> None:
    _, theirs = mirrored(mirror, fake)
    failed = theirs | {"attempt_count": 1, "next_payment_attempt": int(time.time()) + 86400}
    evt = event("invoice.payment_failed", failed)
    first, second = deliver(client, evt), deliver(client, evt)
    assert first.json()["duplicate"] is False
    assert second.status_code == 200 and second.json()["duplicate"] is True
    assert count(mirror, PaymentFailure) == 1
    assert count(mirror, StripeWebhookEvent) == 1


def test_payment_failure_is_visible_to_the_customer(
    mirror: Mirror, fake: FakeStripe, client: TestClient, console: Console
) -> None:
    invoice_id, theirs = mirrored(mirror, fake)
    deliver(client, event("invoice.payment_failed", theirs | {"attempt_count": 2}))
    customer_id = mirror.invoice(invoice_id).customer_id
    key = console.post(f"/v1/customers/{customer_id}/keys", {"name": "own"})["key"]
    view = client.get(
        f"/v1/stripe/invoices/{invoice_id}", headers={"Authorization": f"Bearer {key}"}
    ).json()
    (failure,) = view["payment_failures"]
    assert (failure["attempt_count"], failure["amount_due"], failure["currency"]) == (
        2,
        "70.76",
        "USD",
    )
    assert mirror.invoice(invoice_id).status == InvoiceStatus.FINALIZED  # still due


def test_voided_and_uncollectible_are_recorded(
    mirror: Mirror, fake: FakeStripe, client: TestClient
) -> None:
    invoice_id, theirs = mirrored(mirror, fake)
    deliver(client, event("invoice.marked_uncollectible", theirs | {"status": "uncollectible"}))
    assert mirror.invoice(invoice_id).stripe_status == "uncollectible"
    deliver(client, event("invoice.voided", theirs | {"status": "void"}))
    ours = mirror.invoice(invoice_id)
    # gpumeter is the source of truth: a void made in Stripe alone is flagged, not copied.
    assert (ours.status, ours.stripe_status) == (InvoiceStatus.FINALIZED, "void")
    assert ours.stripe_error == "voided in Stripe but not in gpumeter"


def test_event_for_an_unknown_invoice_is_stored_and_acknowledged(
    mirror: Mirror, client: TestClient
) -> None:
    evt = event("invoice.paid", {"id": "in_nobody", "object": "invoice", "metadata": {}})
    assert deliver(client, evt).status_code == 200
    with transaction(mirror.engine) as session:
        assert session.get_one(StripeWebhookEvent, evt["id"]).outcome == "unknown_invoice"


def _top_up(customer_id: str, **fields: Any) -> dict[str, Any]:
    obj = {
        "id": "pi_3Qx",
        "object": "payment_intent",
        "amount_received": 2500,
        "currency": "usd",
        "metadata": {"gpumeter_top_up_customer": customer_id},
    }
    return event("payment_intent.succeeded", {**obj, **fields})


def _signed_text(payload: str) -> dict[str, str]:
    header = stripe.WebhookSignature.generate_signature_header(payload, WEBHOOK_SECRET)
    return {"Stripe-Signature": header, "Content-Type": "application/json"}


# Signed with the right secret, so past the signature check, but not shaped as Stripe's events
# are: each was a plain-text 500 (an AttributeError, TypeError, KeyError or ValueError in a
# handler) or reached the database (a too-long id, \u0000, NaN).
WRONG_SHAPES: dict[str, Callable[[str], str]] = {
    "a list": lambda _: "[1, 2]",
    "a string object": lambda _: json.dumps({**event("invoice.paid", {}), "data": {"object": "x"}}),
    "no data": lambda _: json.dumps(
        {k: v for k, v in event("invoice.paid", {}).items() if k != "data"}
    ),
    "an amount as text": lambda c: json.dumps(_top_up(c, amount_received="25.00")),
    "a null amount": lambda c: json.dumps(_top_up(c, amount_received=None)),
    "an amount as a list": lambda c: json.dumps(_top_up(c, amount_received=[1])),
    "no object id": lambda c: json.dumps(
        {
            **_top_up(c),
            "data": {
                "object": {k: v for k, v in _top_up(c)["data"]["object"].items() if k != "id"}
            },
        }
    ),
    "metadata not text": lambda c: json.dumps(_top_up(c, metadata={"gpumeter_top_up_customer": 7})),
    "a far future": lambda _: json.dumps({**event("customer.created", {}), "created": 10**20}),
    "a long id": lambda _: json.dumps(event("customer.created", {}, event_id="evt_" + "x" * 300)),
    "a NUL character": lambda _: json.dumps(event("customer.created", {"name": "a\u0000b"})),
    "NaN": lambda _: json.dumps(event("customer.created", {"balance": float("nan")})),
}


@pytest.mark.parametrize("shape", list(WRONG_SHAPES))
def test_a_signed_event_of_the_wrong_shape_is_a_400_saying_where(
    mirror: Mirror, console: Console, shape: str
) -> None:
    acme = console.customer("Acme")
    payload = WRONG_SHAPES[shape](acme["id"])
    response = console.client.post(WEBHOOK, content=payload, headers=_signed_text(payload))
    assert response.status_code == 400, response.text
    problems = response.json()["detail"]
    assert {p["type"] for p in problems} == {"invalid_event"}
    assert all(p["loc"][0] == "body" and "Stripe event" in p["msg"] for p in problems)
    assert count(mirror, StripeWebhookEvent) == 0
    balance = console.client.get(f"/v1/customers/{acme['id']}/balance", headers=console.headers)
    assert balance.json()["balance"] == "0.00"
