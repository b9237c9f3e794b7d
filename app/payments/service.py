"""Stripe mirror bookkeeping: queueing invoices for the sync, and Stripe's webhook events.

With no ``GPUMETER_STRIPE_API_KEY`` nothing is queued and invoices stay in gpumeter alone.
Webhook handling never voids or reopens our invoices: gpumeter is the source of truth, so a
Stripe-side change we did not ask for is recorded on the invoice (``stripe_error``) for an
operator to act on.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import stripe
from prometheus_client import Counter
from pydantic import ValidationError
from sqlalchemy import func
from sqlalchemy.orm import Session

from app.auth.service import Principal
from app.balances import service as balances_service
from app.billing import reads as billing_reads
from app.billing import service as billing_service
from app.billing.models import Invoice, InvoiceStatus
from app.core.epoch import from_epoch
from app.core.errors import ApiError, Conflict, not_found
from app.customers.service import customer_by_id
from app.events.models import DomainEvent
from app.payments import repository
from app.payments.jobs import wake_sync
from app.payments.models import (
    PaymentFailure,
    StripeOutbox,
    StripeWebhookEvent,
    SyncState,
    SyncTarget,
)
from app.payments.schemas import InvoiceStripeRead, PaymentFailureRead, StripeEventIn, SyncRead
from app.payments.stripe_api import META_INVOICE, from_stripe_amount, to_stripe_amount
from app.settings import Settings

log = logging.getLogger(__name__)

MISMATCHES = Counter(
    "gpumeter_stripe_payment_mismatches_total",
    "invoice.paid events not applied: amount, currency or mode differ from our invoice.",
)


@dataclass(frozen=True)
class StripeSettings:
    """The Stripe keys the payments follow, handed in by their callers."""

    api_key: str | None
    webhook_secret: str | None

    @classmethod
    def of(cls, settings: Settings) -> StripeSettings:
        return cls(settings.stripe_api_key, settings.stripe_webhook_secret)

    @property
    def enabled(self) -> bool:
        return bool(self.api_key)

    @property
    def live(self) -> bool:
        return "_live_" in (self.api_key or "")


def on_invoice_event(session: Session, event: DomainEvent, stripe_keys: StripeSettings) -> None:
    """``invoice.finalized`` / ``invoice.voided``: queue the Stripe mirror of the invoice, in
    the transaction that finalized or voided it (the outbox guarantee)."""
    invoice = billing_reads.invoice_by_id(session, uuid.UUID(event.data["invoice_id"]))
    queue_stripe_sync(session, invoice, stripe_keys)


def queue_stripe_sync(session: Session, invoice: Invoice, stripe_keys: StripeSettings) -> None:
    """Queue ``invoice`` (just finalized or voided) for the sync, in the same transaction."""
    if not stripe_keys.enabled or invoice.status == InvoiceStatus.DRAFT:
        return
    target = SyncTarget.VOID if invoice.status == InvoiceStatus.VOID else SyncTarget.FINALIZED
    item = repository.outbox_for_invoice(session, invoice.id)
    if item is None:
        if target == SyncTarget.VOID:
            return  # never queued, so nothing exists in Stripe to void
        item = StripeOutbox(invoice_id=invoice.id, customer_id=invoice.customer_id, target=target)
        session.add(item)
    elif item.target != target:
        item.target = target
        _requeue(item)
    session.flush()
    wake_sync(session)


def _requeue(item: StripeOutbox) -> None:
    item.state = SyncState.PENDING
    item.attempts = 0
    item.next_attempt_at = func.now()
    item.last_error = None


def invoice_view(
    session: Session, invoice_id: uuid.UUID, principal: Principal
) -> InvoiceStripeRead:
    invoice = billing_service.get_invoice(session, invoice_id, principal)
    item = repository.outbox_for_invoice(session, invoice_id)
    failures = session.scalars(repository.payment_failures_query(invoice_id=invoice_id)).all()
    return InvoiceStripeRead(
        invoice_id=invoice.id,
        customer_id=invoice.customer_id,
        stripe_invoice_id=invoice.stripe_invoice_id,
        stripe_invoice_number=invoice.stripe_invoice_number,
        stripe_hosted_url=invoice.stripe_hosted_url,
        stripe_status=invoice.stripe_status,
        stripe_error=invoice.stripe_error,
        sync=SyncRead.model_validate(item) if item else None,
        payment_failures=[PaymentFailureRead.model_validate(f) for f in failures],
    )


def retry_sync(session: Session, invoice_id: uuid.UUID) -> StripeOutbox:
    """Send a failed (or waiting) sync to the worker again, now."""
    item = repository.outbox_for_invoice(session, invoice_id)
    if item is None:
        raise not_found("Stripe sync of invoice", invoice_id)
    if item.state == SyncState.SYNCED:
        raise Conflict(
            f"invoice {invoice_id} is already mirrored in Stripe", ("path", "invoice_id")
        )
    _requeue(item)
    session.flush()
    session.refresh(item)
    wake_sync(session)
    return item


# -- webhooks ---------------------------------------------------------------------------------


class BadSignature(ApiError):
    error_type = "invalid_signature"


class BadEvent(ApiError):
    """Signed, but not shaped as a Stripe event: a 400 saying where (Stripe never sends one)."""

    error_type = "invalid_event"


def _verified_event(
    payload: bytes, signature: str | None, secret: str
) -> tuple[StripeEventIn, dict[str, Any]]:
    """The event, once its signature (the HMAC and a timestamp within Stripe's 300 s) and
    its shape (the fields the handlers read) hold; and its body as stored."""
    try:
        text = payload.decode("utf-8")
        stripe.WebhookSignature.verify_header(
            text, signature, secret, stripe.Webhook.DEFAULT_TOLERANCE
        )
    except stripe.SignatureVerificationError as error:
        raise BadSignature(
            f"invalid Stripe signature: {error}", ("header", "stripe-signature")
        ) from None
    except UnicodeDecodeError:
        raise BadEvent("the body is not a Stripe event: not UTF-8", ("body",)) from None
    try:
        body = json.loads(text, parse_constant=_no_constant)
        if "\\u0000" in text:  # JSON may escape it; Postgres's jsonb cannot hold it
            raise ValueError("a string holds \\u0000")
        return StripeEventIn.model_validate(body), body
    except ValidationError as error:
        problems = [
            {"loc": ["body", *e["loc"]], "msg": f"not a Stripe event: {e['msg']}"}
            for e in error.errors()
        ]
        raise BadEvent.many(problems) from None
    except ValueError as error:
        raise BadEvent(f"the body is not a Stripe event: {error}", ("body",)) from None


def _object_id(obj: dict[str, Any]) -> str:
    """The id of the event's object, which a payment or invoice always has."""
    ident: str | None = obj.get("id")
    if ident is None:
        raise BadEvent("not a Stripe event: its object has no id", ("body", "data", "object", "id"))
    return ident


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def receive_webhook(
    session: Session, payload: bytes, signature: str | None, stripe_keys: StripeSettings
) -> tuple[str, bool]:
    """Verify, store once and apply a Stripe event; (event id, whether it was a duplicate)."""
    secret = stripe_keys.webhook_secret
    if not secret:  # a 4xx: Stripe keeps redelivering until the secret is configured
        raise BadSignature("no Stripe webhook secret is configured", ("header", "stripe-signature"))
    event, body = _verified_event(payload, signature, secret)
    if not repository.insert_event(session, event.id, event.type, body):
        return event.id, True
    row = session.get_one(StripeWebhookEvent, event.id)
    obj: dict[str, Any] = body["data"]["object"]
    row.stripe_object_id = obj.get("id")
    if event.type == TOP_UP_EVENT:
        row.outcome = _top_up(session, obj)
        session.flush()
        return event.id, False
    handler = _HANDLERS.get(event.type)
    invoice = _our_invoice(session, obj) if handler else None
    row.invoice_id = invoice.id if invoice else None
    if handler is None:
        row.outcome = "ignored"
    elif invoice is None:
        row.outcome = "unknown_invoice"
    else:
        row.outcome = "applied"  # unless the handler says otherwise
        handler(session, invoice, obj, row, stripe_keys)
    session.flush()
    return event.id, False


# A prepaid top-up is a PaymentIntent created with metadata gpumeter_top_up_customer=<our
# customer id> (a Checkout Session in payment mode passes it on via payment_intent_data).
TOP_UP_EVENT = "payment_intent.succeeded"
META_TOP_UP_CUSTOMER = "gpumeter_top_up_customer"


def _top_up(session: Session, obj: dict[str, Any]) -> str:
    """Record a succeeded top-up payment on the customer's prepaid balance (app.balances),
    once per payment; the webhook row's outcome says what became of any other payment."""
    tagged = (obj.get("metadata") or {}).get(META_TOP_UP_CUSTOMER)
    if tagged is None:
        return "ignored"  # an invoice's payment: invoice.paid reports it
    try:
        customer = customer_by_id(session, uuid.UUID(tagged))
    except ValueError:
        customer = None
    if customer is None:
        return "unknown_customer"
    currency = str(obj.get("currency", "")).upper()
    if currency != customer.currency:
        return "wrong_currency"  # kept on the row for an operator: refund or convert by hand
    amount = from_stripe_amount(int(obj.get("amount_received", 0)), currency)
    balances_service.top_up_from_payment(session, customer, _object_id(obj), amount, currency)
    return "applied"


def _our_invoice(session: Session, obj: dict[str, Any]) -> Invoice | None:
    if obj.get("object") != "invoice":
        return None
    return billing_reads.invoice_for_stripe(
        session, obj.get("id", ""), (obj.get("metadata") or {}).get(META_INVOICE)
    )


def _at(epoch: int | None) -> datetime | None:
    return None if epoch is None else from_epoch(epoch)


def _paid(
    session: Session,
    invoice: Invoice,
    obj: dict[str, Any],
    event: StripeWebhookEvent,
    stripe_keys: StripeSettings,
) -> None:
    mismatch = _payment_mismatch(invoice, obj, stripe_keys.live)
    if mismatch is not None:  # recorded on the inbox row and the invoice, counted, logged
        event.outcome = "mismatch"
        invoice.stripe_error = f"invoice.paid {event.id} not applied: {mismatch}"
        MISMATCHES.inc()
        log.warning("stripe payment mismatch", extra={"event": event.id, "reason": mismatch})
        return
    invoice.stripe_status = "paid"
    if invoice.status == InvoiceStatus.FINALIZED:
        paid_at = _at(event.payload.get("created")) or datetime.now(UTC)
        billing_service.mark_invoice_paid(session, invoice, paid_at)
    elif invoice.status == InvoiceStatus.VOID:
        invoice.stripe_error = "paid in Stripe although void in gpumeter: refund it in Stripe"


def _payment_mismatch(invoice: Invoice, obj: dict[str, Any], live: bool) -> str | None:
    """What about a paid Stripe invoice does not match ours (None: it matches): the amount
    paid must be our total to the minor unit, in our currency, and in the mode (live or test,
    ``live``) of our Stripe key, so a test-mode or partial payment never marks an invoice
    paid."""
    currency = str(obj.get("currency", "")).upper()
    if currency != invoice.currency:
        return f"paid in {currency or 'no currency'}, but the invoice is in {invoice.currency}"
    expected = to_stripe_amount(invoice.total, invoice.currency)
    paid = obj.get("amount_paid")
    if paid != expected:
        return f"{paid} paid (minor units), but the invoice's total is {expected}"
    if obj.get("livemode") is not live:
        mode = "live" if obj.get("livemode") else "test"
        return f"paid in Stripe's {mode} mode, but our key is for {'live' if live else 'test'}"
    return None


def _payment_failed(
    session: Session,
    invoice: Invoice,
    obj: dict[str, Any],
    event: StripeWebhookEvent,
    _: StripeSettings,
) -> None:
    session.add(
        PaymentFailure(
            event_id=event.id,
            invoice_id=invoice.id,
            customer_id=invoice.customer_id,
            stripe_invoice_id=_object_id(obj),
            amount_due=from_stripe_amount(int(obj.get("amount_due", 0)), invoice.currency),
            currency=invoice.currency,
            attempt_count=int(obj.get("attempt_count") or 0),
            next_payment_attempt=_at(obj.get("next_payment_attempt")),
            occurred_at=_at(event.payload.get("created")) or datetime.now(UTC),
        )
    )


def _stripe_status(status: str, unexpected: str | None) -> Callable[..., None]:
    """A handler recording Stripe's new status; ``unexpected`` flags it unless ours is void."""

    def handler(_: Session, invoice: Invoice, *__: object) -> None:
        invoice.stripe_status = status
        if unexpected and invoice.status != InvoiceStatus.VOID:
            invoice.stripe_error = unexpected

    return handler


_Handler = Callable[[Session, Invoice, dict[str, Any], StripeWebhookEvent, StripeSettings], None]
_HANDLERS: dict[str, _Handler] = {
    "invoice.paid": _paid,
    "invoice.payment_failed": _payment_failed,
    "invoice.voided": _stripe_status("void", "voided in Stripe but not in gpumeter"),
    "invoice.marked_uncollectible": _stripe_status("uncollectible", None),
}
