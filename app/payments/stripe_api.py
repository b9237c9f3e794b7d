"""The Stripe SDK as the mirror uses it: the client, idempotency keys, amounts, error kinds.

Idempotency keys are derived from our ids only, so every retry of a call (the SDK's own
immediate retries and the sync's later attempts alike) sends the same key and Stripe replays
its first answer instead of creating a second object. Stripe forgets keys after 24 hours;
past that, the sync finds what it created by the ``gpumeter_*`` metadata instead.
"""

from __future__ import annotations

import uuid
from decimal import Decimal

import stripe

from app.core.money import minor_units
from app.settings import Settings

# Stripe keeps ISK as a two-decimal currency in its API (amounts are multiples of 100).
_STRIPE_EXPONENT = {"ISK": 2}
# Stripe's three-decimal currencies: amounts in thousandths, whose last digit must be 0.
# Billing rounds them to 0.010 already (``app.core.money``), so the check only guards.
_STRIPE_STEP = {"BHD": 10, "JOD": 10, "KWD": 10, "OMR": 10, "TND": 10}

META_CUSTOMER = "gpumeter_customer_id"
META_INVOICE = "gpumeter_invoice_id"
META_LINE = "gpumeter_line_id"
META_CREDIT_NOTE = "gpumeter_credit_note_id"


class MirrorError(Exception):
    """Stripe and gpumeter disagree in a way no retry fixes; the sync of the invoice stops."""


def make_client(settings: Settings) -> stripe.StripeClient:
    if not settings.stripe_api_key:
        raise RuntimeError("GPUMETER_STRIPE_API_KEY is not set; the Stripe mirror is off")
    return stripe.StripeClient(
        settings.stripe_api_key,
        base_addresses={"api": settings.stripe_api_base} if settings.stripe_api_base else None,
        max_network_retries=settings.stripe_max_network_retries,
    )


def customer_key(customer_id: uuid.UUID) -> str:
    return f"gpumeter-customer-{customer_id}"


def invoice_key(invoice_id: uuid.UUID, action: str) -> str:
    return f"gpumeter-invoice-{invoice_id}-{action}"


def line_key(invoice_id: uuid.UUID, line_id: int) -> str:
    return f"gpumeter-invoice-{invoice_id}-line-{line_id}"


def credit_note_key(credit_note_id: uuid.UUID) -> str:
    return f"gpumeter-credit-note-{credit_note_id}"


def to_stripe_amount(amount: Decimal, currency: str) -> int:
    """``amount`` as an integer count of Stripe's smallest unit; exact or an error (KWD
    1.230 -> 1230; KWD 1.235 is refused: Stripe takes only multiples of ten fils)."""
    exponent = _STRIPE_EXPONENT.get(currency, minor_units(currency))
    scaled = amount.scaleb(exponent)
    if scaled != scaled.to_integral_value():
        raise MirrorError(f"{amount} {currency} is not a whole number of minor units")
    if int(scaled) % _STRIPE_STEP.get(currency, 1):
        raise MirrorError(f"{amount} {currency}: Stripe takes only amounts ending in 0")
    return int(scaled)


def from_stripe_amount(units: int, currency: str) -> Decimal:
    return Decimal(units).scaleb(-_STRIPE_EXPONENT.get(currency, minor_units(currency)))


def is_transient(error: stripe.StripeError) -> bool:
    """Worth retrying later: Stripe unreachable, overloaded, rate limiting or a lock conflict."""
    if isinstance(error, stripe.APIConnectionError | stripe.RateLimitError):
        return True
    status = error.http_status or 0
    return status >= 500 or status == 409
