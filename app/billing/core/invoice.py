"""Invoice assembly: rental lines, then vouchers, then one tax line, then the prepaid balance.

API:
    build_invoice(invoice_id, customer_id, currency, rated_rentals, vouchers, as_of, tax_rate,
                  adjustments=(), balance=0) -> Invoice
    credit_note_lines(lines, currency) -> list[InvoiceLine]

Rules: adjustment lines (late data for earlier periods) follow the rental lines; vouchers
apply to the sum of both (never below zero) and each application is its own negative line;
tax = tax_rate x (sum of lines after vouchers), rounded once; total = sum of all lines
including tax and the prepaid balance. The voucher ledger entries the invoice implies come
back with it, for the caller to persist in the same transaction.

Prepaid balance last (app.balances explains why): after tax, ``min(balance, sum so far)`` is
one negative ``prepaid_balance`` line, so the total is what is left to pay, never below zero,
and the balance pays tax as money would; vouchers, being discounts, lower the taxable amount
first.

No negative invoices: when negative adjustments take the sum of rental and adjustment lines
below zero, the excess becomes credit notes, one per corrected invoice, taken from the most
negative adjustment total first (then by invoice id); each is a positive ``credit_note`` line
(referencing the invoice it corrects) that brings this invoice's sum back to exactly zero,
and the caller issues the matching credit note when it finalizes the invoice.
"""

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal

from app.billing.core.lines import InvoiceLine, LineKind, sum_amounts
from app.billing.core.rating import RatedRental
from app.billing.core.vouchers import OpenVoucher, VoucherEntry, apply_vouchers
from app.core.money import round_money


@dataclass(frozen=True)
class Invoice:
    invoice_id: str
    customer_id: str
    currency: str
    lines: tuple[InvoiceLine, ...]
    voucher_applications: tuple[VoucherEntry, ...]
    voucher_expirations: tuple[VoucherEntry, ...]

    @property
    def total(self) -> Decimal:
        return sum_amounts(self.lines, self.currency)


def build_invoice(
    invoice_id: str,
    customer_id: str,
    currency: str,
    rated_rentals: Iterable[RatedRental],
    vouchers: Sequence[OpenVoucher],
    as_of: int,
    tax_rate: Decimal,
    adjustments: Iterable[InvoiceLine] = (),
    balance: Decimal = Decimal(0),
) -> Invoice:
    lines = [line for rated in rated_rentals for line in rated.lines]
    lines += adjustments
    if any(line.currency != currency for line in lines):
        raise ValueError(f"all rental lines must be in {currency}")
    lines += credit_note_lines(lines, currency)
    applications, expirations = apply_vouchers(
        vouchers, sum_amounts(lines, currency), as_of, invoice_id
    )
    lines += [
        InvoiceLine(LineKind.VOUCHER, -a.amount, currency, voucher_id=a.voucher_id)
        for a in applications
    ]
    tax = round_money(sum_amounts(lines, currency) * tax_rate, currency)
    lines.append(InvoiceLine(LineKind.TAX, tax, currency, rate=tax_rate))
    if (paid := min(balance, sum_amounts(lines, currency))) > 0:
        lines.append(InvoiceLine(LineKind.PREPAID_BALANCE, -paid, currency))
    return Invoice(
        invoice_id, customer_id, currency, tuple(lines), tuple(applications), tuple(expirations)
    )


def credit_note_lines(lines: Sequence[InvoiceLine], currency: str) -> list[InvoiceLine]:
    """The credit-note lines that bring a negative sum of ``lines`` back to zero."""
    excess = -sum_amounts(lines, currency)
    adjusted: dict[tuple[str, str | None], Decimal] = defaultdict(Decimal)
    for line in lines:
        if line.kind is LineKind.ADJUSTMENT and line.adjusts_invoice_id is not None:
            adjusted[line.adjusts_invoice_id, line.adjusts_period] += line.amount
    notes = []
    for (invoice_id, period), amount in sorted(adjusted.items(), key=lambda a: (a[1], a[0])):
        if excess <= 0 or amount >= 0:
            break
        take = min(excess, -amount)
        excess -= take
        notes.append(
            InvoiceLine(
                LineKind.CREDIT_NOTE,
                take,
                currency,
                adjusts_invoice_id=invoice_id,
                adjusts_period=period,
            )
        )
    return notes
