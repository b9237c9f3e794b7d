"""Prepaid balance and trial credit: a ledger per customer in integer minor units.

Money comes in as the signup trial credit (``GPUMETER_TRIAL_CREDIT``, once per customer,
granted when the customer is created) and as top-ups (an admin through the API, or a Stripe
payment through app.payments). It goes out only to invoices: billing applies the balance when
it finalizes one, and gives it back when that invoice is voided.

Order on the invoice (DESIGN): rental lines, adjustments, credit notes, caps and vouchers
first, then tax, then the prepaid balance. A voucher is a discount that expires and lowers the
taxable amount; a prepaid balance is money the customer already paid, which never expires and
pays what is due, tax included. Spending the balance first would let vouchers lapse unused and
would tax less than the supply was worth, so vouchers come first and the balance last. The
invoice shows the "prepaid balance applied" amount as its own line; its total is what is due.

Rules: every movement is idempotent by its key (``trial:<customer>``, ``stripe:<payment>``,
``invoice:<invoice>``, ``void:<invoice>``); the balance never goes below zero (refused here,
and by a check on each entry's running balance); a debit that takes it from at or above
``GPUMETER_BALANCE_LOW_THRESHOLD`` to below publishes ``balance.low``.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from decimal import Decimal

from sqlalchemy.orm import Session

from app.balances import repository
from app.balances.models import BalanceEntry, EntryKind
from app.core.errors import Conflict, Unprocessable
from app.core.money import MAX_AMOUNT, from_minor, round_money, to_minor
from app.customers.models import Customer
from app.events.service import publish

BALANCE_LOW = "balance.low"


def balance(session: Session, customer: Customer) -> Decimal:
    """The customer's balance now, in its currency (zero when it never had one)."""
    return from_minor(_balance_minor(session, customer), customer.currency)


def available(session: Session, customers: Sequence[Customer]) -> dict[uuid.UUID, Decimal]:
    """The balance an invoice may take, per customer, with the ledgers locked until the
    transaction ends, so the amount a draft shows is still there when that draft is finalized.
    For many customers at once (an invoice run): the locks in one statement, the balances read
    in another."""
    ids = [c.id for c in customers]
    repository.lock_ledgers(session, ids)
    latest = repository.latest_of(session, ids)
    return {
        c.id: from_minor(_running_minor(latest.get((c.id, c.currency))), c.currency)
        for c in customers
    }


def low_threshold(setting: Decimal, currency: str) -> Decimal:
    """Below this the balance is low: the setting (``balance_low_threshold``) in the
    customer's currency."""
    return round_money(setting, currency)


def grant_trial_credit(session: Session, customer: Customer, amount: Decimal) -> None:
    """The signup credit of ``amount`` (``trial_credit``), once per customer whatever calls it
    (the customer's creation)."""
    if amount > 0:
        units = _units(amount, customer.currency, ("settings", "trial_credit"))
        _post(session, customer, EntryKind.TRIAL, units, f"trial:{customer.id}", "signup credit")


def top_up(
    session: Session,
    customer: Customer,
    amount: Decimal,
    reason: str,
    *,
    key: str | None = None,
    created_by: uuid.UUID | None = None,
) -> BalanceEntry:
    """Money paid in advance: by an admin (``created_by``), or a payment (its ``key``)."""
    units = _units(amount, customer.currency, ("body", "amount"))
    key = key or f"admin:{uuid.uuid4()}"
    return _post(session, customer, EntryKind.TOP_UP, units, key, reason, created_by=created_by)


def top_up_from_payment(
    session: Session, customer: Customer, payment_id: str, amount: Decimal, currency: str
) -> BalanceEntry:
    """A Stripe payment's top-up; a redelivered payment finds its entry and adds nothing."""
    if currency != customer.currency:
        raise Unprocessable(
            f"payment {payment_id} is in {currency}; the customer is billed in {customer.currency}",
            ("body", "currency"),
        )
    reason = f"Stripe payment {payment_id}"
    key = f"stripe:{payment_id}"
    return top_up(session, customer, amount, reason, key=key)


def apply_to_invoice(
    session: Session,
    customer: Customer,
    invoice_id: uuid.UUID,
    number: str,
    amount: Decimal,
    low_setting: Decimal,
) -> BalanceEntry:
    """Take ``amount`` (what the draft showed) for the invoice being finalized; once only.
    Taking it below ``low_threshold(low_setting)`` publishes ``balance.low`` (the only movement
    that takes money out, so the only one that can)."""
    units = -_units(amount, customer.currency, ("invoice", str(invoice_id)))
    reason = f"applied to invoice {number}"
    key = f"invoice:{invoice_id}"
    low = low_threshold(low_setting, customer.currency)
    return _post(session, customer, EntryKind.APPLIED, units, key, reason, invoice_id, low=low)


def return_from_invoice(
    session: Session, customer: Customer, invoice_id: uuid.UUID, number: str
) -> None:
    """Give back what a voided invoice took, once."""
    applied = repository.by_key(session, f"invoice:{invoice_id}")
    if applied is not None:
        reason = f"returned from voided invoice {number}"
        key = f"void:{invoice_id}"
        units = -applied.amount_minor
        _post(session, customer, EntryKind.RETURNED, units, key, reason, invoice_id)


def _units(amount: Decimal, currency: str, loc: tuple[str, ...]) -> int:
    try:
        return to_minor(amount, currency)
    except ValueError as error:
        raise Unprocessable(str(error), loc) from None


def _balance_minor(session: Session, customer: Customer) -> int:
    return _running_minor(repository.latest(session, customer.id, customer.currency))


def _running_minor(last: BalanceEntry | None) -> int:
    """The running balance after ``last``, in minor units (0 before any entry)."""
    return 0 if last is None else last.balance_minor


def _post(
    session: Session,
    customer: Customer,
    kind: EntryKind,
    units: int,
    key: str,
    reason: str,
    invoice_id: uuid.UUID | None = None,
    *,
    created_by: uuid.UUID | None = None,
    low: Decimal | None = None,
) -> BalanceEntry:
    """Append one movement under the ledger lock; the same key again returns its entry. A
    debit taking the balance from at or above ``low`` to below publishes ``balance.low``."""
    repository.lock_ledger(session, customer.id)
    if (done := repository.by_key(session, key)) is not None:
        if done.amount_minor != units:
            raise Conflict(f"balance entry {key} was recorded with another amount", ("body",))
        return done
    before = _balance_minor(session, customer)
    after = before + units
    if after < 0:
        raise Conflict(
            f"the balance is {from_minor(before, customer.currency)} {customer.currency}: "
            f"{from_minor(-units, customer.currency)} cannot be taken from it",
            ("body", "amount"),
        )
    if after > to_minor(MAX_AMOUNT, customer.currency):
        raise Unprocessable(
            f"the balance is {from_minor(before, customer.currency)} {customer.currency}: "
            f"{from_minor(units, customer.currency)} more would take it past the largest a "
            f"balance may hold, {MAX_AMOUNT:f}",
            ("body", "amount"),
        )
    entry = BalanceEntry(
        key=key,
        customer_id=customer.id,
        kind=kind.value,
        amount_minor=units,
        balance_minor=after,
        currency=customer.currency,
        invoice_id=invoice_id,
        reason=reason,
        created_by=created_by,
        at=datetime.now(UTC),
    )
    session.add(entry)
    session.flush()
    if low is not None and before >= (threshold := to_minor(low, customer.currency)) > after:
        _publish_low(session, customer, after, threshold)
    return entry


def _publish_low(session: Session, customer: Customer, units: int, threshold: int) -> None:
    currency = customer.currency
    data = {
        "customer_id": customer.id,
        "currency": currency,
        "balance": str(from_minor(units, currency)),
        "threshold": str(from_minor(threshold, currency)),
    }
    publish(session, BALANCE_LOW, data, subject=f"balance/{customer.id}", customer_id=customer.id)
