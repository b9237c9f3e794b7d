"""Stripe top-ups: a succeeded PaymentIntent tagged with our customer tops up its prepaid
balance once (app.balances), whatever Stripe redelivers; other payments change nothing."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from app.core.db import transaction
from app.payments.models import StripeWebhookEvent
from app.settings import Settings
from tests.billing.world import get
from tests.harness import Console
from tests.payments.conftest import event, signed

WEBHOOK = "/v1/stripe/webhook"


def deliver(client: TestClient, evt: dict[str, Any]) -> dict[str, Any]:
    payload, headers = signed(evt)
    response = client.post(WEBHOOK, content=payload, headers=headers)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def payment(customer_id: str, units: int = 2500, currency: str = "usd") -> dict[str, Any]:
    return {
        "id": f"pi_{uuid.uuid4().hex[:16]}",
        "object": "payment_intent",
        "amount_received": units,
        "currency": currency,
        "metadata": {"gpumeter_top_up_customer": customer_id},
    }


def outcome(db: Engine, event_id: str) -> str:
    with transaction(db) as session:
        return session.get_one(StripeWebhookEvent, event_id).outcome


def test_a_stripe_payment_tops_up_the_balance_once(
    settings: Settings, console: Console, client: TestClient, db: Engine
) -> None:
    acme = console.customer("Acme")
    paid = payment(acme["id"])
    first = event("payment_intent.succeeded", paid)
    assert deliver(client, first)["duplicate"] is False
    assert deliver(client, first)["duplicate"] is True  # the same event redelivered
    deliver(client, event("payment_intent.succeeded", paid))  # the same payment, a new event
    balance = get(console, f"/v1/customers/{acme['id']}/balance")
    assert balance["balance"] == "25.00"
    [entry] = get(console, f"/v1/customers/{acme['id']}/balance/entries")["items"]
    assert (entry["kind"], entry["amount"], entry["reason"]) == (
        "top_up",
        "25.00",
        f"Stripe payment {paid['id']}",
    )
    assert outcome(db, first["id"]) == "applied"


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        pytest.param(lambda p: p | {"metadata": {}}, "ignored", id="an-invoice-payment"),
        pytest.param(
            lambda p: p | {"metadata": {"gpumeter_top_up_customer": str(uuid.uuid4())}},
            "unknown_customer",
            id="unknown-customer",
        ),
        pytest.param(
            lambda p: p | {"metadata": {"gpumeter_top_up_customer": "not-a-uuid"}},
            "unknown_customer",
            id="malformed-customer",
        ),
        pytest.param(lambda p: p | {"currency": "eur"}, "wrong_currency", id="other-currency"),
    ],
)
def test_other_payments_leave_the_balance_alone(
    settings: Settings, console: Console, client: TestClient, db: Engine, change: Any, expected: str
) -> None:
    acme = console.customer("Acme")
    evt = event("payment_intent.succeeded", change(payment(acme["id"])))
    deliver(client, evt)
    assert outcome(db, evt["id"]) == expected
    assert get(console, f"/v1/customers/{acme['id']}/balance")["balance"] == "0.00"
