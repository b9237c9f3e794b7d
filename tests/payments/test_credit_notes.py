"""Credit notes into Stripe, and three-decimal currencies as Stripe takes them."""

from __future__ import annotations

import uuid
from decimal import Decimal

import pytest

from app.billing.models import CreditNote
from app.core.db import transaction
from app.payments.stripe_api import MirrorError, to_stripe_amount
from tests.payments.conftest import NOW, TOTAL_MINOR, Mirror
from tests.payments.fake_stripe import FakeStripe


def _credit_note(mirror: Mirror, corrected: uuid.UUID, total: str = "1.49") -> uuid.UUID:
    """A credit note of ``total`` (1.25 + 0.24 tax) on ``corrected``, issued with a December
    invoice of the same customer."""
    customer = mirror.invoice(corrected).customer_id
    december = mirror.draft(customer, period="2026-12")
    with transaction(mirror.engine) as session:
        note = CreditNote(
            customer_id=customer,
            number="CN-2026-000001",
            invoice_id=corrected,
            issued_with_invoice_id=december,
            currency="USD",
            amount=Decimal(total) - Decimal("0.24"),
            tax_rate=Decimal("0.19"),
            tax=Decimal("0.24"),
            total=Decimal(total),
            reason="late-data corrections to GM-2026-000001 (2026-11)",
            issued_at=NOW,
        )
        session.add(note)
        session.flush()
        return note.id


def _note(mirror: Mirror, note_id: uuid.UUID) -> CreditNote:
    with transaction(mirror.engine) as session:
        return session.get_one(CreditNote, note_id)


def test_a_credit_note_is_mirrored_once_on_the_invoice_it_corrects(
    mirror: Mirror, fake: FakeStripe
) -> None:
    invoice = mirror.finalized()
    note_id = _credit_note(mirror, invoice)
    assert mirror.sync() == 2  # the invoice, then its credit note
    stripe_invoice = mirror.invoice(invoice).stripe_invoice_id
    assert stripe_invoice is not None
    [theirs] = fake.credit_notes.values()
    assert (theirs["invoice"], theirs["total"], theirs["status"]) == (stripe_invoice, 149, "issued")
    assert theirs["metadata"]["gpumeter_credit_note_id"] == str(note_id)
    assert fake.invoices[stripe_invoice]["amount_due"] == TOTAL_MINOR - 149
    ours = _note(mirror, note_id)
    assert (ours.stripe_id, ours.stripe_status, ours.stripe_error) == (theirs["id"], "issued", None)
    assert mirror.sync() == 0  # nothing left to do: never a second credit note
    assert len(fake.credit_notes) == 1


def test_a_lost_answer_finds_the_credit_note_again_instead_of_creating_another(
    mirror: Mirror, fake: FakeStripe
) -> None:
    invoice = mirror.finalized()
    mirror.sync()
    note_id = _credit_note(mirror, invoice)
    with fake.down("lose"):  # Stripe creates it, but the answer never arrives
        mirror.sync()
    assert _note(mirror, note_id).stripe_id is None
    mirror.sync()
    [theirs] = fake.credit_notes.values()
    assert _note(mirror, note_id).stripe_id == theirs["id"]


def test_a_credit_note_stripe_refuses_is_stopped_with_its_reason(
    mirror: Mirror, fake: FakeStripe
) -> None:
    invoice = mirror.finalized()
    note_id = _credit_note(mirror, invoice, total="999.00")  # more than the invoice's total
    mirror.sync()
    assert "at most the invoice's remaining total" in (_note(mirror, note_id).stripe_error or "")
    assert fake.credit_notes == {}
    assert mirror.sync() == 0  # not retried


def test_three_decimal_currencies_go_to_stripe_in_steps_of_ten() -> None:
    assert to_stripe_amount(Decimal("1.230"), "KWD") == 1230
    assert to_stripe_amount(Decimal("-0.010"), "BHD") == -10
    with pytest.raises(MirrorError, match="ending in 0"):
        to_stripe_amount(Decimal("1.235"), "KWD")
    assert to_stripe_amount(Decimal("1.23"), "USD") == 123
    assert to_stripe_amount(Decimal("151"), "JPY") == 151
