"""Cost and usage exports of a period: a plain CSV and a FOCUS 1.2 CSV, streamed.

Source: the lines of the customer's invoice for the period (draft or finalized, never void),
so every export sums exactly to that invoice; with no invoice yet (the open month, or a month
the run has not drafted), the period to date rated as the invoice will be (charges, credits
and caps: what the overview calls cost to date; vouchers, tax and the prepaid balance come
with the invoice). Each line is split by the customer's local days
(written in UTC, as FOCUS requires): a line with a time span is spread over the days it covers
in proportion to its seconds in each, the rounding remainder given by largest remainder, so
the day parts of a line add up to the line; a line without a span (tax, voucher) is one row
over the whole period. Credit lines name their GPU; charge lines are per rental and price
period, so their rows name the rental, not a GPU.

Streaming: an invoice's lines are read through a server-side cursor (``yield_per``) in their
own read-only transaction and written out row by row; a month of a 3,000-GPU fleet never sits
in memory. The period to date is rated before the response starts (its lines are per rental
and price period, and per credited incident: a few thousand at most).

The FOCUS 1.2 export's columns are ``app.dashboard.focus``'s (docs/focus.md).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from itertools import pairwise
from zoneinfo import ZoneInfo

from sqlalchemy.orm import Session

from app.billing import reads as billing_reads
from app.billing import usage as billing_usage
from app.billing.core.lines import LineKind
from app.billing.loader import BillingPeriod
from app.billing.models import Invoice, InvoiceLineRow
from app.billing.rollups import day_bounds
from app.billing.usage import UsageSettings
from app.core.epoch import epoch, from_epoch
from app.core.money import minor_units
from app.customers.models import Customer

_BATCH = 500  # lines fetched per round trip of the server-side cursor
_CHUNK = 64 * 1024  # characters of CSV per streamed chunk

_USAGE_NUMBERS = frozenset({"seconds", "gpu_hours", "rate_per_gpu_hour", "amount"})
USAGE_COLUMNS = (
    "period",
    "day",
    "rental_id",
    "gpu_model",
    "gpu_uuid",
    "kind",
    "seconds",
    "gpu_hours",
    "rate_per_gpu_hour",
    "amount",
    "currency",
    "invoice",
)

_USAGE_KINDS = {LineKind.CHARGE, LineKind.ADJUSTMENT}
_TIMED_KINDS = _USAGE_KINDS | {
    LineKind.FAILURE_CREDIT,
    LineKind.MIGRATION_CREDIT,
    LineKind.DEGRADED_CREDIT,
    LineKind.STALL_CREDIT,
}


@dataclass(frozen=True)
class DayPart:
    """One invoice line's share of one local day (or of the period, for lines without time)."""

    line: InvoiceLineRow
    start: int
    end: int
    amount: Decimal
    seconds: Decimal | None  # the line's GPU-seconds in this part (exact; may be fractional)


def find_invoice(session: Session, customer: Customer, period: BillingPeriod) -> Invoice | None:
    """The customer's invoice for the period (draft or finalized), if the run made one."""
    return billing_reads.live_invoice(session, customer.id, period.name)


@dataclass(frozen=True)
class Statement:
    """What an export is of: the period's invoice, or with none yet, the period to date (its
    lines rated now, not stored)."""

    period: BillingPeriod
    currency: str
    invoice: Invoice | None
    to_date: tuple[InvoiceLineRow, ...] = ()

    @property
    def label(self) -> str:
        """The usage CSV's ``invoice`` column."""
        if self.invoice is None:
            return f"{self.period.name} to date"
        return self.invoice.number or f"draft {self.invoice.id}"

    @property
    def invoice_id(self) -> str:
        """FOCUS ``InvoiceId``: the number, a draft's id, or null before there is an invoice."""
        if self.invoice is None:
            return ""
        return self.invoice.number or str(self.invoice.id)


def statement(
    session: Session,
    customer: Customer,
    period: BillingPeriod,
    now: datetime,
    config: UsageSettings,
) -> Statement:
    """The period's invoice, else its lines to date, rated as the invoice will rate them."""
    invoice = find_invoice(session, customer, period)
    if invoice is not None:
        return Statement(period, invoice.currency, invoice)
    to_date = billing_usage.lines_to_date(session, customer, period, now, config)
    return Statement(period, customer.currency, None, tuple(to_date))


def day_parts(session: Session, source: Statement) -> Iterator[DayPart]:
    """The lines split by local day, in line order; an invoice's read a batch at a time."""
    period, currency = source.period, source.currency
    days = day_bounds(period)
    if source.invoice is None:
        for line in source.to_date:
            yield from _split(line, days, period, currency)
        return
    for line in billing_reads.lines_of(session, source.invoice.id, _BATCH):
        yield from _split(line, days, period, currency)
        session.expunge(line)  # keep the identity map (and memory) flat


def _split(
    line: InvoiceLineRow, days: list[int], period: BillingPeriod, currency: str
) -> Iterator[DayPart]:
    if line.start_at is None or line.end_at is None or line.kind not in _TIMED_KINDS:
        seconds = None if line.seconds is None else Decimal(line.seconds)
        yield DayPart(line, *period.span, line.amount, seconds)
        return
    lo, hi = epoch(line.start_at), epoch(line.end_at)
    pieces = [(max(a, lo), min(b, hi)) for a, b in pairwise(days) if a < hi and lo < b] or [
        (lo, max(hi, lo + 1))
    ]
    weights = [b - a for a, b in pieces]
    amounts = allocate(line.amount, weights, currency)
    total = sum(weights)
    for (a, b), weight, amount in zip(pieces, weights, amounts, strict=True):
        seconds = None if line.seconds is None else Decimal(line.seconds) * weight / total
        yield DayPart(line, a, b, amount, seconds)


def allocate(amount: Decimal, weights: list[int], currency: str) -> list[Decimal]:
    """``amount`` split by ``weights`` at the currency's minor unit; the parts sum to it.

    Largest remainder: each part is rounded toward zero, and the units left over go, one
    each, to the parts with the largest remainders (ties to the earliest).
    """
    exponent = minor_units(currency)
    units = int(amount.scaleb(exponent))
    total = sum(weights)
    sign = -1 if units < 0 else 1
    exact = [abs(units) * w for w in weights]
    parts = [e // total for e in exact]
    order = sorted(range(len(weights)), key=lambda i: (-(exact[i] % total), i))
    for i in order[: abs(units) - sum(parts)]:
        parts[i] += 1
    return [Decimal(sign * p).scaleb(-exponent) for p in parts]


# --- CSV writing --------------------------------------------------------------------------


# OWASP's CSV injection rule: a spreadsheet reads a cell starting with one of these as a
# formula (or, with tab and CR, may), so such a text cell gets a leading apostrophe, which
# spreadsheets show as text and do not evaluate.
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def inert(cell: object) -> object:
    """A text cell a spreadsheet will not evaluate (numbers are left to the caller)."""
    if isinstance(cell, str) and cell.startswith(_FORMULA_STARTS):
        return "'" + cell
    return cell


def csv_chunks(
    header: Sequence[str], rows: Iterable[Sequence[object]], numeric: Collection[str]
) -> Iterator[str]:
    """The CSV in chunks of about ``_CHUNK`` characters: a chunk per row cost a thread hop
    each in the streaming response (most of a 3,000-GPU month's time).

    Every cell of a column not in ``numeric`` is made ``inert``; numeric columns hold only
    numbers this module formats, so a credit's ``-1.95`` stays a number a sheet can sum.
    """
    text = [i for i, name in enumerate(header) if name not in numeric]
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    for row in rows:
        cells = list(row)
        for i in text:
            cells[i] = inert(cells[i])
        writer.writerow(cells)
        if buffer.tell() >= _CHUNK:
            yield buffer.getvalue()
            buffer.seek(0)
            buffer.truncate()
    yield buffer.getvalue()


def _num(value: Decimal | None, places: int | None = None) -> str:
    if value is None:
        return ""
    if places is not None:
        value = value.quantize(Decimal(1).scaleb(-places))
    return f"{value:f}"


def usage_csv(parts: Iterable[DayPart], source: Statement, timezone: str) -> Iterator[str]:
    zone = ZoneInfo(timezone)
    number, period, currency = source.label, source.period.name, source.currency

    def row(p: DayPart) -> list[object]:
        line = p.line
        hours = None if p.seconds is None else p.seconds / 3600
        return [
            period,
            from_epoch(p.start).astimezone(zone).date().isoformat(),
            line.rental_id or "",
            line.gpu_model or "",
            line.gpu_uuid or "",
            line.kind,
            _num(p.seconds, 0),
            _num(hours, 6),
            _num(line.rate.normalize())
            if line.rate is not None and line.kind != LineKind.TAX
            else "",
            _num(p.amount, minor_units(currency)),
            currency,
            number,
        ]

    return csv_chunks(USAGE_COLUMNS, (row(p) for p in parts), _USAGE_NUMBERS)
