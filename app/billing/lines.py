"""Invoice line values and their constructors.

Each line's amount is rounded exactly once (``app.core.money``); every total is a plain sum
of rounded line amounts. Charges are positive; credits, cap and vouchers are negative.

API:
    LineKind, InvoiceLine
    charge_line(rental_id, gpu_model, span, seconds, price, currency) -> InvoiceLine
    credit_line(rental_id, gpu_model, piece, price, currency) -> InvoiceLine
    cap_line(rental_id, net, cap, currency) -> InvoiceLine | None
    sum_amounts(lines, currency) -> Decimal
"""

from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from enum import StrEnum

from app.billing.domain import Bucket, Evidence, Piece
from app.billing.intervals import Span
from app.core.money import time_amount, zero


class LineKind(StrEnum):
    CHARGE = "charge"
    FAILURE_CREDIT = "failure_credit"
    MIGRATION_CREDIT = "migration_credit"
    DEGRADED_CREDIT = "degraded_credit"
    CAP = "cap"
    ADJUSTMENT = "adjustment"  # late data re-rated for an earlier finalized period
    VOUCHER = "voucher"
    TAX = "tax"


_CREDIT_KIND = {
    Bucket.FAILURE_CREDIT: LineKind.FAILURE_CREDIT,
    Bucket.MIGRATION_CREDIT: LineKind.MIGRATION_CREDIT,
    Bucket.DEGRADED_CREDIT: LineKind.DEGRADED_CREDIT,
}


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


def credit_line(
    rental_id: str, gpu_model: str, piece: Piece, price: Decimal, currency: str
) -> InvoiceLine:
    """The negative mirror of a credited piece (one incident within one price period)."""
    return InvoiceLine(
        kind=_CREDIT_KIND[piece.bucket],
        amount=-time_amount(piece.seconds, price, currency),
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


def cap_line(
    rental_id: str, net: Decimal, cap: Decimal | None, currency: str
) -> InvoiceLine | None:
    """A negative line bringing ``net`` down to ``cap`` when the cap binds."""
    if cap is None or net <= cap:
        return None
    return InvoiceLine(kind=LineKind.CAP, amount=cap - net, currency=currency, rental_id=rental_id)


def sum_amounts(lines: Iterable[InvoiceLine], currency: str) -> Decimal:
    return sum((line.amount for line in lines), zero(currency))
