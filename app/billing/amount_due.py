"""The path from usage cost to the amount due, computed once for the API, the pages and the
invoice document:

    usage (GPU time less credits) -> monthly cap -> [corrections of earlier months] -> vouchers
    -> subtotal -> tax -> total -> prepaid balance -> amount due

Source: the period's invoice (its stored lines) when the invoice run made one; else the period
to date rated as the invoice would be (``invoice.build_invoice`` over the rentals rated so far,
the vouchers usable now and the prepaid balance now), which is what an invoice finalized now
would show, without the late-data corrections of earlier months (those are found by the run).
Each step is a plain sum of the lines of its kinds, so the steps add up to the amount due.

Vouchers (``vouchers`` and ``service``): a draft applies those usable when it was computed, a
finalized invoice those usable at its finalization, oldest expiry first, never below zero due;
vouchers an invoice earns (long-rental tiers) are issued at its finalization, so they apply to
the next invoice finalized before they expire, never to the one that earned them. The reason
given says which of these holds, so a voucher balance beside $0 applied reads as it should.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from sqlalchemy.orm import Session

from app.balances import service as balances
from app.billing import reads, repository
from app.billing.core.invoice import build_invoice
from app.billing.core.lines import CREDIT_KINDS, LineKind
from app.billing.core.rating import RatedRental
from app.billing.core.vouchers import EntryKind, open_vouchers, usable
from app.billing.loader import BillingPeriod
from app.billing.models import Invoice, InvoiceStatus, VoucherEntryRow
from app.billing.schemas import AmountDueRead, MoneyStepRead, VouchersAppliedRead, money
from app.billing.service import core_errors, ledger
from app.billing.usage import UsageSettings, rated_to_date
from app.billing.wording import percent
from app.core.epoch import epoch, from_epoch
from app.core.money import display
from app.customers.models import Customer

# Step key -> label, in chain order; "corrections" only when an invoice carries some.
STEPS = {
    "usage": "Usage (GPU time less credits)",
    "cap": "Monthly cap",
    "corrections": "Corrections of earlier months",
    "vouchers": "Vouchers",
    "subtotal": "Subtotal",
    "tax": "Tax",
    "total": "Total",
    "prepaid": "Prepaid balance applied",
    "amount_due": "Amount due",
}
_STEP_OF = {
    LineKind.CHARGE: "usage",
    **{kind: "usage" for kind in CREDIT_KINDS},
    LineKind.CAP: "cap",
    LineKind.ADJUSTMENT: "corrections",
    LineKind.CREDIT_NOTE: "corrections",
    LineKind.VOUCHER: "vouchers",
    LineKind.TAX: "tax",
    LineKind.PREPAID_BALANCE: "prepaid",
}
_SUMS = {"subtotal": ("usage", "cap", "corrections", "vouchers"), "total": ("subtotal", "tax")}


@dataclass(frozen=True)
class Chain:
    """The steps' amounts (exact sums of rounded lines) in one currency."""

    amounts: dict[str, Decimal]
    tax_rate: Decimal

    @classmethod
    def of(cls, lines: Iterable[tuple[str, Decimal]], tax_rate: Decimal) -> Chain:
        amounts = dict.fromkeys(STEPS, Decimal(0))
        for kind, amount in lines:
            amounts[_STEP_OF[LineKind(kind)]] += amount
        for key, parts in _SUMS.items():
            amounts[key] = sum((amounts[p] for p in parts), Decimal(0))
        amounts["amount_due"] = amounts["total"] + amounts["prepaid"]
        return cls(amounts, tax_rate)

    def steps(self, currency: str) -> list[MoneyStepRead]:
        return [
            MoneyStepRead(key=key, label=self._label(key), amount=money(amount, currency))
            for key, amount in self.amounts.items()
            if key != "corrections" or amount
        ]

    def _label(self, key: str) -> str:
        return f"Tax {percent(self.tax_rate)}" if key == "tax" else STEPS[key]

    @property
    def before_vouchers(self) -> Decimal:
        return self.amounts["usage"] + self.amounts["cap"] + self.amounts["corrections"]


def of_period(
    session: Session,
    customer: Customer,
    period: BillingPeriod,
    now: datetime,
    config: UsageSettings,
    rated: Sequence[RatedRental] | None = None,
) -> AmountDueRead:
    """The period's invoice's chain, else the period to date's; ``rated``: the rentals rated
    to date when the caller has them (the overview), so they are not rated twice."""
    invoice = reads.live_invoice(session, customer.id, period.name)
    if invoice is not None:
        return of_invoice(session, invoice, customer, now)
    if rated is None:
        span = (period.span[0], min(period.span[1], epoch(now)))
        rated = rated_to_date(session, customer, period, span, config).rated
    return _to_date(session, customer, period, rated, now)


def of_invoice(
    session: Session, invoice: Invoice, customer: Customer, now: datetime
) -> AmountDueRead:
    chain = Chain.of(((line.kind, line.amount) for line in invoice.lines), invoice.tax_rate)
    entries = _vouchers_of(session, customer)
    return AmountDueRead(
        customer_id=customer.id,
        period=invoice.period,
        currency=invoice.currency,
        source="invoice",
        invoice_id=invoice.id,
        invoice_number=invoice.number,
        status=invoice.status.value,
        as_of=invoice.finalized_at or invoice.generated_at,
        steps=chain.steps(invoice.currency),
        amount_due=money(chain.amounts["amount_due"], invoice.currency),
        vouchers=_applied(chain, entries, now, invoice.currency, invoice),
        cap=_cap_note(chain, invoice.currency),
    )


def _to_date(
    session: Session,
    customer: Customer,
    period: BillingPeriod,
    rated: Sequence[RatedRental],
    now: datetime,
) -> AmountDueRead:
    entries = _vouchers_of(session, customer)
    as_of = epoch(now)
    usable = open_vouchers(ledger(e for e in entries if epoch(e.at) <= as_of))
    tax_rate = customer.tax_rate or Decimal(0)
    with core_errors(customer):
        built = build_invoice(
            "preview",
            str(customer.id),
            customer.currency,
            rated,
            usable,
            as_of,
            tax_rate,
            balance=balances.balance(session, customer),
        )
    chain = Chain.of(((line.kind.value, line.amount) for line in built.lines), tax_rate)
    currency = customer.currency
    return AmountDueRead(
        customer_id=customer.id,
        period=period.name,
        currency=currency,
        source="to_date",
        invoice_id=None,
        invoice_number=None,
        status=None,
        as_of=from_epoch(min(period.span[1], as_of)),
        steps=chain.steps(currency),
        amount_due=money(chain.amounts["amount_due"], currency),
        vouchers=_applied(chain, entries, now, currency),
        cap=_cap_note(chain, currency),
    )


def _vouchers_of(session: Session, customer: Customer) -> list[VoucherEntryRow]:
    rows = repository.voucher_entries(session, [customer.id]).get(customer.id, [])
    return [e for e in rows if e.currency == customer.currency]


def _applied(
    chain: Chain,
    entries: list[VoucherEntryRow],
    now: datetime,
    currency: str,
    invoice: Invoice | None = None,
) -> VouchersAppliedRead:
    usable_now = usable(open_vouchers(ledger(entries)), epoch(now))
    applied = -chain.amounts["vouchers"]
    facts = _VoucherFacts(applied, usable_now, chain.before_vouchers, currency)
    reason = facts.preview() if invoice is None else facts.on_invoice(invoice, entries)
    return VouchersAppliedRead(
        usable=money(usable_now, currency), applied=money(applied, currency), reason=reason
    )


@dataclass(frozen=True)
class _VoucherFacts:
    applied: Decimal
    usable: Decimal  # now
    before_vouchers: Decimal
    currency: str

    def m(self, amount: Decimal) -> str:
        return display(amount, self.currency)

    def nothing_due(self) -> str | None:
        if self.applied or self.before_vouchers > 0:
            return None
        cost = self.m(self.before_vouchers)
        return f"Nothing to apply vouchers to: the cost after the cap is {cost}."

    def preview(self) -> str:
        if (text := self.nothing_due()) is not None:
            return text
        if not self.usable:
            return "No vouchers to apply: you have none that has not expired."
        rest = ", the rest stays for later invoices" if self.applied < self.usable else ""
        return (
            "Vouchers apply when the month's invoice is finalized, oldest expiry first. "
            f"Finalized now, {self.m(self.applied)} of your {self.m(self.usable)} would "
            f"apply{rest}."
        )

    def on_invoice(self, invoice: Invoice, entries: list[VoucherEntryRow]) -> str:
        if invoice.status is InvoiceStatus.VOID:
            return (
                "A void invoice applies nothing: the vouchers it had used were given back, and "
                "what was left of those it earned was taken back (its replacement earns them)."
            )
        draft = invoice.status is InvoiceStatus.DRAFT
        when = invoice.generated_at if draft else invoice.finalized_at
        assert when is not None  # a finalized or paid invoice has its finalization time
        day = when.strftime("%Y-%m-%d %H:%M UTC")
        if (text := self.nothing_due()) is not None:
            return text
        if self.applied:
            if draft:
                return (
                    f"This draft applies {self.m(self.applied)}: the vouchers usable when it "
                    f"was computed ({day}), oldest expiry first. Finalization applies those "
                    "usable then."
                )
            return (
                f"{self.m(self.applied)} of vouchers applied at finalization ({day}), oldest "
                "expiry first."
            )
        earned = [e for e in entries if e.invoice_id == invoice.id and e.kind == EntryKind.ISSUED]
        if earned and not draft:
            amount = sum((e.amount for e in earned), Decimal(0))
            return (
                f"This invoice earned {self.m(amount)} of long-rental vouchers, issued when it "
                "was finalized: they apply to your next invoice finalized before they expire, "
                "not to this one."
            )
        if self.usable:
            if draft:
                return (
                    f"This draft was computed on {day}, before your {self.m(self.usable)} of "
                    "vouchers were usable: finalization applies them."
                )
            return (
                f"Your {self.m(self.usable)} of vouchers were issued after this invoice was "
                f"finalized ({day}): they apply to your next invoice."
            )
        done = "computed" if draft else "finalized"
        return f"You had no usable vouchers when this invoice was {done}."


def _cap_note(chain: Chain, currency: str) -> str | None:
    cap = chain.amounts["cap"]
    if not cap:
        return None
    return (
        f"Your monthly cap lowered the cost by {display(-cap, currency)}: per-second billing "
        "never costs more than the plan's monthly price per GPU, prorated to the time rented "
        "and not credited."
    )
