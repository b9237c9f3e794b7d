"""The Stripe sync: drains the outbox, mirroring each invoice into Stripe (a queue job runs it,
``app.payments.jobs``).

Per outbox row (one per invoice), under a lease taken with ``FOR UPDATE SKIP LOCKED`` so
several workers never work on one invoice at once:

1. customer: reuse ours' ``stripe_customer_id``, else find it by metadata, else create it;
2. invoice: find the draft by metadata, else create it (``auto_advance`` off, our customer's
   collection method, pending items excluded);
3. items: list the invoice's items, check every one is ours with our amount, create the
   missing ones (one per line, amounts in the currency's minor unit, credits negative);
4. finalize: Stripe's ``amount_due`` must equal our total to the cent, before and after;
   store Stripe's invoice id, number and hosted URL on ours.

Voiding runs instead of 1-4 when the target is ``void``: a draft is deleted, an open invoice
is voided. Each step commits its own transaction and records its progress, so a crash resumes
after the last completed step; every create carries an idempotency key derived from our ids.
Transient Stripe errors (network, 5xx, 429, 409) reschedule the row with exponential backoff;
anything else stops the row as ``failed`` with the reason on the row and on the invoice.

Credit notes (``sync_credit_notes``, a step of its own each pass): every credit note not yet
in Stripe whose corrected invoice is open or paid in Stripe becomes a Stripe credit note on
that invoice, one custom line for its total (tax included), found again by its metadata
before it is created (idempotency key from our id, too). A transient error leaves it for the
next pass; any other is stored on the credit note and it is not tried again.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import stripe
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from app.billing import reads as billing_reads
from app.billing.models import CreditNote, Invoice, InvoiceLineRow
from app.core.db import transaction
from app.customers.models import Customer
from app.customers.service import existing_customer
from app.payments import repository
from app.payments.models import StripeOutbox, SyncState, SyncStep, SyncTarget
from app.payments.stripe_api import (
    META_CREDIT_NOTE,
    META_CUSTOMER,
    META_INVOICE,
    META_LINE,
    MirrorError,
    credit_note_key,
    customer_key,
    invoice_key,
    is_transient,
    line_key,
    to_stripe_amount,
)
from app.settings import Settings

log = logging.getLogger(__name__)

_STEP_ORDER = list(SyncStep)


class LeaseLost(Exception):
    """Another worker took the row over (our lease expired); stop without writing."""


def _now() -> datetime:
    return datetime.now(UTC)


def backoff_s(attempts: int, settings: Settings) -> float:
    return min(settings.stripe_retry_base_s * 2 ** (attempts - 1), settings.stripe_retry_max_s)


def _advance(item: StripeOutbox, step: SyncStep) -> None:
    if _STEP_ORDER.index(step) > _STEP_ORDER.index(item.step):
        item.step = step


def _describe(line: InvoiceLineRow, currency: str) -> str:
    what = line.kind.replace("_", " ")
    if line.seconds is not None and line.rate is not None:
        gpu = f"{line.gpu_model} " if line.gpu_model else ""
        return f"{gpu}{what}: {line.seconds} GPU-s at {line.rate.normalize():f} {currency}/GPU-h"
    if line.rate is not None:  # the tax line carries its rate
        return f"{what} at {(line.rate * 100).normalize():f} %"
    return what


def _due(stripe_invoice: Any, expected: int) -> None:
    if stripe_invoice.amount_due != expected:
        raise MirrorError(
            f"Stripe invoice {stripe_invoice.id} is due {stripe_invoice.amount_due} but our "
            f"total is {expected} (minor units)"
        )


def _line_of(stripe_item: Any) -> str | None:
    metadata = stripe_item.metadata
    line: str | None = metadata.to_dict().get(META_LINE) if metadata else None
    return line


def _options(key: str) -> stripe.RequestOptions:
    return {"idempotency_key": key}


@dataclass
class SyncJob:
    """One worker's pass over one leased outbox row."""

    engine: Engine
    client: stripe.StripeClient
    settings: Settings
    outbox_id: int
    owner: str
    after_item: Callable[[], None] | None = None  # test hook: runs after each item is created

    @contextmanager
    def _step(self) -> Iterator[tuple[Session, StripeOutbox, Invoice]]:
        """One step's transaction, only while we still hold the lease (which it extends)."""
        with transaction(self.engine) as session:
            item = repository.leased_item(session, self.outbox_id, self.owner)
            if item is None:
                raise LeaseLost(self.outbox_id)
            item.leased_until = _now() + timedelta(seconds=self.settings.stripe_lease_s)
            yield session, item, billing_reads.invoice_by_id(session, item.invoice_id)

    def run(self) -> None:
        try:
            self._release(*self._attempt())
        except LeaseLost:
            log.warning("stripe sync lease lost", extra={"outbox_id": self.outbox_id})

    def _attempt(self) -> tuple[SyncState, str | None]:
        """Bring Stripe to the row's target; the row's next state and the error, if any."""
        try:
            with self._step() as (_, item, _invoice):
                target = item.target
            if target == SyncTarget.VOID:
                self._void()
            else:
                self._mirror()
        except MirrorError as error:
            return SyncState.FAILED, str(error)
        except stripe.StripeError as error:
            message = f"{type(error).__name__}: {error.user_message or error}"
            return (SyncState.PENDING if is_transient(error) else SyncState.FAILED), message
        return SyncState.SYNCED, None

    def _release(self, state: SyncState, error: str | None) -> None:
        error = error[:2000] if error else None  # the columns' width
        with self._step() as (_, item, invoice):
            item.state, item.last_error = state, error
            item.lease_owner = item.leased_until = None
            invoice.stripe_error = error if state == SyncState.FAILED else None
            if state == SyncState.PENDING:
                item.attempts += 1
                delay = backoff_s(item.attempts, self.settings)
                item.next_attempt_at = _now() + timedelta(seconds=delay)
            if state == SyncState.SYNCED:
                item.synced_at = _now()
        log.info("stripe sync", extra={"outbox_id": self.outbox_id, "state": state, "error": error})

    # -- mirroring --------------------------------------------------------------------------

    def _mirror(self) -> None:
        customer_id = self._ensure_customer()
        stripe_invoice = self._ensure_invoice(customer_id)
        if stripe_invoice.status == "draft":
            self._ensure_items(customer_id, stripe_invoice.id)
        self._finalize(stripe_invoice.id)

    def _ensure_customer(self) -> str:
        with self._step() as (session, item, invoice):
            if invoice.total < 0:
                # Stripe would turn a negative total into customer credit balance that
                # gpumeter does not track; billing never produces one, so it is an error.
                raise MirrorError(f"invoice total {invoice.total} is negative")
            customer = existing_customer(session, item.customer_id, for_update=True)
            if customer.stripe_customer_id is None:
                customer.stripe_customer_id = self._find_or_create_customer(customer)
            _advance(item, SyncStep.CUSTOMER)
            return customer.stripe_customer_id

    def _find_or_create_customer(self, customer: Customer) -> str:
        query = f"metadata['{META_CUSTOMER}']:'{customer.id}'"
        found = self.client.v1.customers.search({"query": query}).data
        if found:
            return found[0].id
        params: stripe.params.CustomerCreateParams = {
            "name": customer.name,
            "metadata": {META_CUSTOMER: str(customer.id)},
        }
        if customer.email:
            params["email"] = customer.email
        return self.client.v1.customers.create(params, _options(customer_key(customer.id))).id

    def _ensure_invoice(self, stripe_customer_id: str) -> stripe.Invoice:
        with self._step() as (session, item, invoice):
            if invoice.stripe_invoice_id is not None:
                found = self.client.v1.invoices.retrieve(invoice.stripe_invoice_id)
            else:
                found = self._find_invoice(invoice.id) or self._create_invoice(
                    invoice, existing_customer(session, invoice.customer_id), stripe_customer_id
                )
                invoice.stripe_invoice_id = found.id
            invoice.stripe_status = found.status
            _advance(item, SyncStep.INVOICE)
            return found

    def _find_invoice(self, invoice_id: uuid.UUID) -> stripe.Invoice | None:
        query = f"metadata['{META_INVOICE}']:'{invoice_id}'"
        found = self.client.v1.invoices.search({"query": query}).data
        return found[0] if found else None

    def _create_invoice(
        self, invoice: Invoice, customer: Customer, stripe_customer_id: str
    ) -> stripe.Invoice:
        params: stripe.params.InvoiceCreateParams = {
            "customer": stripe_customer_id,
            "currency": invoice.currency.lower(),
            "collection_method": customer.collection_method,
            "auto_advance": False,  # we finalize it ourselves, after checking the amounts
            "pending_invoice_items_behavior": "exclude",
            "description": f"gpumeter invoice {invoice.number} ({invoice.period})",
            "metadata": {
                META_INVOICE: str(invoice.id),
                META_CUSTOMER: str(invoice.customer_id),
                "gpumeter_number": invoice.number or "",
            },
        }
        if customer.collection_method == "send_invoice":
            params["days_until_due"] = customer.days_until_due
        return self.client.v1.invoices.create(params, _options(invoice_key(invoice.id, "create")))

    def _ensure_items(self, stripe_customer_id: str, stripe_invoice_id: str) -> None:
        with self._step() as (_, item, invoice):
            listed = self.client.v1.invoice_items.list(
                {"invoice": stripe_invoice_id, "limit": 100}
            ).auto_paging_iter()
            present = self._check_present(invoice, {_line_of(i): i for i in listed})
            item.items_created = len(present)
            missing = [line for line in invoice.lines if str(line.id) not in present]
        for line in missing:
            with self._step() as (_, item, invoice):
                params = self._item_params(invoice, line, stripe_customer_id, stripe_invoice_id)
                self.client.v1.invoice_items.create(params, _options(line_key(invoice.id, line.id)))
                item.items_created += 1
            if self.after_item is not None:
                self.after_item()
        with self._step() as (_, item, _invoice):
            _advance(item, SyncStep.ITEMS)

    @staticmethod
    def _check_present(invoice: Invoice, present: dict[str | None, Any]) -> dict[str | None, Any]:
        """Items already on the Stripe invoice must each be one of our lines, at its amount."""
        ours = {str(line.id): line for line in invoice.lines}
        for line_id, stripe_item in present.items():
            line = ours.get(line_id or "")
            if line is None:
                raise MirrorError(f"Stripe item {stripe_item.id} is not one of our lines")
            if stripe_item.amount != to_stripe_amount(line.amount, invoice.currency):
                raise MirrorError(f"Stripe item {stripe_item.id} differs from line {line_id}")
        return present

    @staticmethod
    def _item_params(
        invoice: Invoice, line: InvoiceLineRow, customer: str, stripe_invoice_id: str
    ) -> stripe.params.InvoiceItemCreateParams:
        return {
            "customer": customer,
            "invoice": stripe_invoice_id,
            "amount": to_stripe_amount(line.amount, invoice.currency),
            "currency": invoice.currency.lower(),
            "description": _describe(line, invoice.currency),
            "metadata": {META_INVOICE: str(invoice.id), META_LINE: str(line.id)},
        }

    def _finalize(self, stripe_invoice_id: str) -> None:
        with self._step() as (_, item, invoice):
            expected = to_stripe_amount(invoice.total, invoice.currency)
            current = self.client.v1.invoices.retrieve(stripe_invoice_id)
            if current.status == "draft":
                _due(current, expected)  # never finalize a wrong invoice
                key = invoice_key(invoice.id, "finalize")
                current = self.client.v1.invoices.finalize_invoice(
                    stripe_invoice_id, {}, _options(key)
                )
            _due(current, expected)
            invoice.stripe_invoice_number = current.number
            invoice.stripe_hosted_url = current.hosted_invoice_url
            if invoice.stripe_status != "paid":  # an invoice.paid webhook may have come first
                invoice.stripe_status = current.status
            _advance(item, SyncStep.FINALIZED)

    # -- voiding ----------------------------------------------------------------------------

    def _void(self) -> None:
        with self._step() as (_, item, invoice):
            current = self._current(invoice)
            if current is not None and current.status == "draft":
                self.client.v1.invoices.delete(current.id)
                invoice.stripe_status = "deleted"
            elif current is not None and current.status in ("open", "uncollectible"):
                key = invoice_key(invoice.id, "void")
                invoice.stripe_status = self.client.v1.invoices.void_invoice(
                    current.id, {}, _options(key)
                ).status
            elif current is not None and current.status == "paid":
                raise MirrorError("the Stripe invoice is paid: refund it in Stripe, then void")
            _advance(item, SyncStep.VOIDED)

    def _current(self, invoice: Invoice) -> stripe.Invoice | None:
        """The Stripe invoice mirroring ours, if there is one (a deleted draft is none)."""
        if invoice.stripe_invoice_id is None:
            return self._find_invoice(invoice.id)
        try:
            return self.client.v1.invoices.retrieve(invoice.stripe_invoice_id)
        except stripe.InvalidRequestError as error:
            if error.code == "resource_missing":
                return None
            raise


# -- the worker ----------------------------------------------------------------------------


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def claim(engine: Engine, settings: Settings, owner: str) -> int | None:
    """Lease the next due outbox row to ``owner``; its id, or None when nothing is due."""
    with transaction(engine) as session:
        now = _now()
        item = repository.claim_due(session, now)
        if item is None:
            return None
        item.lease_owner = owner
        item.leased_until = now + timedelta(seconds=settings.stripe_lease_s)
        return item.id


def sync_due(
    engine: Engine,
    client: stripe.StripeClient,
    settings: Settings,
    *,
    owner: str | None = None,
    after_item: Callable[[], None] | None = None,
) -> int:
    """Work every outbox row that is due now, once each; how many were worked."""
    owner = owner or worker_id()
    worked = 0
    while (outbox_id := claim(engine, settings, owner)) is not None:
        SyncJob(engine, client, settings, outbox_id, owner, after_item).run()
        worked += 1
    return worked + sync_credit_notes(engine, client)


# -- credit notes --------------------------------------------------------------------------


def sync_credit_notes(engine: Engine, client: stripe.StripeClient) -> int:
    """Mirror every credit note that is due (see the module's doc); how many were worked."""
    with transaction(engine) as session:
        due = [note.id for note in billing_reads.credit_notes_to_mirror(session)]
    for credit_note_id in due:
        with transaction(engine) as session:
            note = billing_reads.lock_credit_note(session, credit_note_id)
            if note is not None:
                _mirror_credit_note(session, client, note)
    return len(due)


def _mirror_credit_note(session: Session, client: stripe.StripeClient, note: CreditNote) -> None:
    invoice = billing_reads.invoice_by_id(session, note.invoice_id)
    try:
        found = _find_credit_note(client, invoice, note) or client.v1.credit_notes.create(
            _credit_note_params(invoice, note), _options(credit_note_key(note.id))
        )
    except MirrorError as error:
        note.stripe_error = str(error)[:2000]
        return
    except stripe.StripeError as error:
        if not is_transient(error):
            note.stripe_error = f"{type(error).__name__}: {error.user_message or error}"[:2000]
        log.warning("stripe credit note", extra={"credit_note": str(note.id), "error": str(error)})
        return
    note.stripe_id, note.stripe_status, note.stripe_error = found.id, found.status, None


def _find_credit_note(
    client: stripe.StripeClient, invoice: Invoice, note: CreditNote
) -> stripe.CreditNote | None:
    assert invoice.stripe_invoice_id is not None  # only such credit notes are due
    listed = client.v1.credit_notes.list({"invoice": invoice.stripe_invoice_id, "limit": 100})
    for found in listed.auto_paging_iter():
        if found.metadata and found.metadata.to_dict().get(META_CREDIT_NOTE) == str(note.id):
            return found
    return None


def _credit_note_params(invoice: Invoice, note: CreditNote) -> stripe.params.CreditNoteCreateParams:
    return {
        "invoice": invoice.stripe_invoice_id or "",
        "lines": [
            {
                "type": "custom_line_item",
                "description": f"gpumeter credit note {note.number}: {note.reason}"[:500],
                "quantity": 1,
                "unit_amount": to_stripe_amount(note.total, note.currency),
            }
        ],
        "memo": f"{note.number}: {note.reason}"[:500],
        "metadata": {META_CREDIT_NOTE: str(note.id), "gpumeter_number": note.number},
    }
