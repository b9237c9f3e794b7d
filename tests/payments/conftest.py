"""Stripe mirror fixtures: the fake Stripe, settings pointing at it, invoices to mirror."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
import stripe
from sqlalchemy import Engine, text

from app.billing import service as billing_service
from app.billing.core.invoice import Invoice as BuiltInvoice
from app.billing.models import Invoice, InvoiceLineRow
from app.core.db import transaction
from app.customers.models import Customer
from app.payments.stripe_api import make_client
from app.payments.stripe_mirror import sync_due
from app.settings import Settings, get_settings
from tests.payments.fake_stripe import FakeStripe, running

WEBHOOK_SECRET = "whsec_test_secret"
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)

# (kind, amount, seconds, rate): a charge, a failure credit, a cap, a voucher and the tax.
LINES: list[tuple[str, str, int | None, str | None]] = [
    ("charge", "69.17", 100_000, "2.49"),
    ("failure_credit", "-1.25", 1_807, "2.49"),
    ("cap", "-5.00", None, None),
    ("voucher", "-3.46", None, None),
    ("tax", "11.30", None, "0.19"),
]
TOTAL_MINOR = 7076


@pytest.fixture
def fake() -> Iterator[FakeStripe]:
    with running(FakeStripe()) as server:
        yield server


def configure(monkeypatch: pytest.MonkeyPatch, **values: object) -> Settings:
    for name, value in values.items():
        monkeypatch.setenv(f"GPUMETER_{name.upper()}", str(value))
    get_settings.cache_clear()
    return get_settings()


@pytest.fixture
def settings(monkeypatch: pytest.MonkeyPatch, fake: FakeStripe) -> Iterator[Settings]:
    """Stripe on, pointed at the fake; no SDK retries and short backoff, to keep tests fast."""
    yield configure(
        monkeypatch,
        stripe_api_key=fake.api_key,
        stripe_api_base=fake.url,
        stripe_webhook_secret=WEBHOOK_SECRET,
        stripe_max_network_retries=0,
        stripe_retry_base_s=0.2,
        stripe_retry_max_s=1,
    )
    get_settings.cache_clear()


@pytest.fixture
def stripe_client(settings: Settings) -> stripe.StripeClient:
    return make_client(settings)


@dataclass
class Mirror:
    """Finalizing invoices through billing's own service, and running the sync."""

    engine: Engine
    settings: Settings
    client: stripe.StripeClient

    def customer(self, **fields: Any) -> uuid.UUID:
        with transaction(self.engine) as session:
            customer = Customer(name="Acme AI", email="ops@acme.example", currency="USD", **fields)
            session.add(customer)
            session.flush()
            return customer.id

    def draft(
        self, customer_id: uuid.UUID, period: str = "2026-11", total: str | None = None
    ) -> uuid.UUID:
        amounts = [Decimal(amount) for _, amount, _, _ in LINES]
        with transaction(self.engine) as session:
            invoice = Invoice(
                customer_id=customer_id,
                period=period,
                period_start=datetime(2026, 11, 1, tzinfo=UTC),
                period_end=datetime(2026, 12, 1, tzinfo=UTC),
                timezone="UTC",
                currency="USD",
                tax_rate=Decimal("0.19"),
                subtotal=sum(amounts[:-1]),
                tax=amounts[-1],
                total=Decimal(total) if total else sum(amounts),
                generated_at=NOW,
            )
            session.add(invoice)
            session.flush()
            for position, (kind, amount, seconds, rate) in enumerate(LINES):
                session.add(
                    InvoiceLineRow(
                        invoice_id=invoice.id,
                        customer_id=customer_id,
                        position=position,
                        kind=kind,
                        amount=Decimal(amount),
                        gpu_model="H100" if seconds else None,
                        seconds=seconds,
                        rate=Decimal(rate) if rate else None,
                    )
                )
            return invoice.id

    def finalize(self, invoice_id: uuid.UUID) -> None:
        with transaction(self.engine) as session:
            invoice = session.get_one(Invoice, invoice_id)
            # The lines were written by hand above: nothing to rate, no vouchers, no notes.
            built = BuiltInvoice(
                str(invoice.id), str(invoice.customer_id), invoice.currency, (), (), ()
            )
            draft = billing_service.Draft(invoice, [], built)
            config = billing_service.BillingSettings.of(get_settings())
            billing_service.finalize_invoice(session, draft, NOW, config, force=True)

    def void(self, invoice_id: uuid.UUID) -> None:
        with transaction(self.engine) as session:
            invoice = session.get_one(Invoice, invoice_id)
            billing_service.void_invoice(session, invoice, NOW, "issued in error")

    def finalized(self, **customer_fields: Any) -> uuid.UUID:
        invoice_id = self.draft(self.customer(**customer_fields))
        self.finalize(invoice_id)
        return invoice_id

    def sync(self, **kwargs: Any) -> int:
        return sync_due(self.engine, self.client, self.settings, **kwargs)

    def invoice(self, invoice_id: uuid.UUID) -> Invoice:
        with transaction(self.engine) as session:
            return session.get_one(Invoice, invoice_id)

    def row(self, invoice_id: uuid.UUID) -> dict[str, Any]:
        with self.engine.connect() as conn:
            query = text("SELECT * FROM stripe_outbox WHERE invoice_id = :id")
            return dict(conn.execute(query, {"id": invoice_id}).mappings().one())

    def expire_leases(self) -> None:
        """What the passing of ``stripe_lease_s`` does after a worker died mid-row."""
        with self.engine.begin() as conn:
            conn.execute(text("UPDATE stripe_outbox SET leased_until = now() - interval '1 s'"))

    def make_due(self) -> None:
        with self.engine.begin() as conn:
            conn.execute(text("UPDATE stripe_outbox SET next_attempt_at = now()"))


@pytest.fixture
def mirror(db: Engine, settings: Settings, stripe_client: stripe.StripeClient) -> Mirror:
    return Mirror(db, settings, stripe_client)


def signed(event: dict[str, Any], timestamp: int | None = None) -> tuple[str, dict[str, str]]:
    """The body and headers of a delivery, signed with the SDK's own helper."""
    payload = json.dumps(event)
    header = stripe.WebhookSignature.generate_signature_header(
        payload, WEBHOOK_SECRET, timestamp=timestamp
    )
    return payload, {"Stripe-Signature": header, "Content-Type": "application/json"}


def event(type_: str, obj: dict[str, Any], event_id: str | None = None) -> dict[str, Any]:
    return {
        "id": event_id or f"evt_{uuid.uuid4().hex[:16]}",
        "object": "event",
        "type": type_,
        "created": int(time.time()),
        "api_version": "2026-10-28.endive",
        "data": {"object": obj},
    }
