"""Invoice line values and their constructors.

Each line's amount is rounded exactly once (``app.core.money``); every total is a plain sum
of rounded line amounts. Charges are positive; credits, cap and vouchers are negative.

API:
    LineKind, InvoiceLine
    charge_line(rental_id, gpu_model, span, seconds, price, currency) -> InvoiceLine
    credit_lines(rental_id, gpu_model, pieces, price, currency, total) -> list[InvoiceLine]
    allocate(exact, total) -> list[int]          # largest-remainder rounding
    cap_line(rental_id, net, allowance, currency, evidence) -> InvoiceLine | None
    sum_amounts(lines, currency) -> Decimal

Credit rounding: within one price period, the charge line is round(charged s x price) and
the net must be round((charged s - credited s) x price), so the credit lines together are
exactly the difference. Each credit line's exact value is seconds x price; the difference is
shared out by largest remainder: every line gets its exact value rounded down to the
currency's quantum, and the quanta still missing go one each to the lines with the largest
remainders (ties: the earlier line). A line's amount is thus always within one quantum of
its own seconds x price, and charge - credits = round(billable seconds x price) exactly.
"""

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from enum import StrEnum
from fractions import Fraction

from app.billing.core.domain import Bucket, Evidence, Piece
from app.billing.core.intervals import Span
from app.core.money import SECONDS_PER_HOUR, quantum, round_money, time_amount, zero


class LineKind(StrEnum):
    CHARGE = "charge"
    FAILURE_CREDIT = "failure_credit"
    MIGRATION_CREDIT = "migration_credit"
    DEGRADED_CREDIT = "degraded_credit"
    STALL_CREDIT = "stall_credit"
    CAP = "cap"
    ADJUSTMENT = "adjustment"  # late data re-rated for an earlier finalized period
    CREDIT_NOTE = "credit_note"  # the part of negative adjustments issued as a credit note
    VOUCHER = "voucher"
    TAX = "tax"
    PREPAID_BALANCE = "prepaid_balance"  # paid from the prepaid balance, after tax (negative)


_CREDIT_KIND = {
    Bucket.FAILURE_CREDIT: LineKind.FAILURE_CREDIT,
    Bucket.MIGRATION_CREDIT: LineKind.MIGRATION_CREDIT,
    Bucket.DEGRADED_CREDIT: LineKind.DEGRADED_CREDIT,
    Bucket.STALL_CREDIT: LineKind.STALL_CREDIT,
}
CREDIT_KINDS = frozenset(_CREDIT_KIND.values())


@dataclass(frozen=True)
class InvoiceLine:
    kind: LineKind
    amount: Decimal
    currency: str
    rental_id: str | None = None
    gpu_model: str | None = None
    gpu_uuid: str | None = None
    start: int | None = None
    end: int | None = None
    seconds: int | None = None
    rate: Decimal | None = None  # price per GPU-hour (time lines) or tax rate (tax line)
    voucher_id: str | None = None
    adjusts_invoice_id: str | None = None  # adjustment lines: the invoice they correct
    adjusts_period: str | None = None  # ... and its period, "YYYY-MM"
    evidence: Evidence | None = field(default=None, hash=False)


def charge_line(
    rental_id: str, gpu_model: str, span: Span, seconds: int, price: Decimal, currency: str
) -> InvoiceLine:
    """Charge for ``seconds`` at ``price``; ``span`` is the price period within the period."""
    return InvoiceLine(
        kind=LineKind.CHARGE,
        amount=time_amount(seconds, price, currency),
        currency=currency,
        rental_id=rental_id,
        gpu_model=gpu_model,
        start=span[0],
        end=span[1],
        seconds=seconds,
        rate=price,
    )


def allocate(exact: Sequence[Fraction], total: int) -> list[int]:
    """Whole numbers summing to ``total``, each its ``exact`` value rounded down or up: the
    largest remainders are rounded up (ties: the earlier one). Should ``total`` lie outside
    [sum of floors, sum of ceilings] (never by more than one), the extra unit goes to (or
    comes from) the same order, never taking a value below zero."""
    shares = [math.floor(x) for x in exact]
    order = sorted(range(len(exact)), key=lambda i: (shares[i] - exact[i], i))
    missing = total - sum(shares)
    while missing > 0:
        for i in order[:missing]:
            shares[i] += 1
        missing = total - sum(shares)
    for i in reversed(order):
        if missing < 0 and shares[i] > 0:
            shares[i] -= 1
            missing += 1
    if missing:
        raise ValueError(f"cannot allocate {total} over {len(exact)} non-negative shares")
    return shares


def credit_lines(
    rental_id: str,
    gpu_model: str,
    pieces: Sequence[Piece],
    price: Decimal,
    currency: str,
    total: Decimal,
) -> list[InvoiceLine]:
    """The negative mirrors of credited pieces in one price period (one per incident), their
    amounts summing to ``-total`` exactly (see the module's rule)."""
    step = quantum(currency)
    exact = [Fraction(p.seconds) * Fraction(price) / SECONDS_PER_HOUR / step for p in pieces]
    units = allocate(exact, int(Fraction(total) / step))
    return [
        InvoiceLine(
            kind=_CREDIT_KIND[piece.bucket],
            amount=round_money(-n * step, currency),  # exact: already a whole quantum
            currency=currency,
            rental_id=rental_id,
            gpu_model=gpu_model,
            gpu_uuid=piece.gpu_uuid,
            start=piece.start,
            end=piece.end,
            seconds=piece.seconds,
            rate=price,
            evidence=piece.evidence,
        )
        for piece, n in zip(pieces, units, strict=True)
    ]


def cap_line(
    rental_id: str,
    net: Decimal,
    allowance: Decimal | None,
    currency: str,
    evidence: Mapping[str, object],
) -> InvoiceLine | None:
    """A negative line bringing the capped ``net`` down to the ``allowance`` when it binds."""
    if allowance is None or net <= allowance:
        return None
    return InvoiceLine(
        kind=LineKind.CAP,
        amount=allowance - net,
        currency=currency,
        rental_id=rental_id,
        evidence=evidence,
    )


def sum_amounts(lines: Iterable[InvoiceLine], currency: str) -> Decimal:
    return sum((line.amount for line in lines), zero(currency))
