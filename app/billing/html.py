"""The invoice document: one text, built once (``invoice_document``), shown three ways with the
same words and amounts: the standalone HTML of ``GET /v1/invoices/{id}/html``
(``render_invoice``), the dashboard's invoice page (``render_document``, the same fragment) and
its PDF (``app.dashboard.pdf`` draws the same document).

It carries the seller (name, address, tax id), "Bill to", the period, issue and due dates, the
lines with their evidence, and the path from usage to the amount due (``amount_due.Chain``):
usage, the monthly cap, vouchers, subtotal, tax, total, the prepaid balance applied and the
amount due. Times are in the invoice's time zone; every value is escaped; no external assets.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from html import escape
from zoneinfo import ZoneInfo

from app.billing import wording
from app.billing.amount_due import Chain
from app.billing.core.evidence import evidence_text
from app.billing.schemas import InvoiceLineRead, InvoiceRead
from app.core.money import display
from app.customers.models import Customer
from app.settings import Settings

_When = Callable[[datetime], str]
COLUMNS = ("Item", "Detail", "Time", "Rate", "Amount")
# Shown in the chain, not as lines of the table.
_TOTAL_KINDS = frozenset({"tax", "prepaid_balance"})
_NOTE = (
    "Amounts are rounded once per line to the currency's minor unit (half up); every total is "
    "the sum of its lines. GPU time is billed per second at an hourly price; a period's "
    "credits share its rounding so that charge less credits is exact."
)


@dataclass(frozen=True)
class DocumentRow:
    kind: str
    cells: tuple[str, str, str, str]  # item, time, rate, amount (the detail is apart)
    detail: tuple[str, ...]  # what the line is about, then its evidence


@dataclass(frozen=True)
class DocumentTotal:
    key: str  # the ``amount_due`` step
    label: str
    amount: str  # for people: "€1,852.56"


@dataclass(frozen=True)
class InvoiceDocument:
    title: str
    status: str
    seller: tuple[str, ...]
    bill_to: tuple[str, ...]
    facts: tuple[str, ...]  # period, dates, currency
    credits: str
    rows: tuple[DocumentRow, ...]
    totals: tuple[DocumentTotal, ...]
    note: str


@dataclass(frozen=True)
class Seller:
    """Who issues the invoices (the ``seller_*`` settings), handed in by the callers."""

    name: str
    address: str
    tax_id: str

    @classmethod
    def of(cls, settings: Settings) -> Seller:
        return cls(settings.seller_name, settings.seller_address, settings.seller_tax_id)

    @property
    def lines(self) -> tuple[str, ...]:
        address = [line.strip() for line in self.address.splitlines() if line.strip()]
        tax_id = [f"Tax id: {self.tax_id}"] if self.tax_id else []
        return (self.name, *address, *tax_id)


def invoice_document(
    invoice: InvoiceRead, customer: Customer, seller: Seller, rentals: Mapping[uuid.UUID, str]
) -> InvoiceDocument:
    """The document; ``rentals``: what its lines call each rental
    (``app.billing.service.rental_names``)."""
    zone = ZoneInfo(invoice.timezone)

    def when(at: datetime) -> str:
        return at.astimezone(zone).strftime("%Y-%m-%d %H:%M:%S %Z")

    currency = invoice.currency
    chain = Chain.of(
        ((x.kind, Decimal(x.amount)) for x in invoice.lines), Decimal(invoice.tax_rate)
    )
    totals = tuple(
        DocumentTotal(step.key, step.label, display(step.amount, currency))
        for step in chain.steps(currency)
    )
    return InvoiceDocument(
        title=f"Invoice {invoice.number}" if invoice.number else f"Draft invoice {invoice.period}",
        status=invoice.status.value,
        seller=seller.lines,
        bill_to=(customer.name, *([customer.email] if customer.email else [])),
        facts=_facts(invoice, customer, when),
        credits=wording.credits_summary(invoice.lines).text,
        rows=tuple(
            _row(x, currency, when, rentals) for x in invoice.lines if x.kind not in _TOTAL_KINDS
        ),
        totals=totals,
        note=_NOTE,
    )


def _facts(invoice: InvoiceRead, customer: Customer, when: _When) -> tuple[str, ...]:
    zone = ZoneInfo(invoice.timezone)
    first = invoice.period_start.astimezone(zone).date()
    last = (invoice.period_end - timedelta(seconds=1)).astimezone(zone).date()
    facts = [f"Period {invoice.period}: {first} to {last} ({invoice.timezone})"]
    if invoice.finalized_at:
        facts.append(f"Issued {when(invoice.finalized_at)}")
    else:
        facts.append(f"Draft computed {when(invoice.generated_at)}")
    if invoice.due_at:
        facts.append(f"Due {when(invoice.due_at)}")
    else:
        facts.append(f"Due {customer.days_until_due} days after it is issued")
    if invoice.paid_at:
        facts.append(f"Paid {when(invoice.paid_at)}")
    if invoice.voided_at:
        facts.append(f"Voided {when(invoice.voided_at)}: {invoice.void_reason}")
    facts.append(f"Currency {invoice.currency}")
    return tuple(facts)


def _row(
    line: InvoiceLineRead, currency: str, when: _When, rentals: Mapping[uuid.UUID, str]
) -> DocumentRow:
    facts = wording.line_facts(line, when, rental=lambda r: rentals.get(r, str(r)))
    detail = ["; ".join(facts)] if facts else []
    time = rate = ""
    if line.seconds is not None and line.rate is not None and line.kind != "tax":
        # In the unit the price is in, seconds beside, and the sum a reader can redo.
        price = Decimal(line.rate)
        time = f"{gpu_hours(line.seconds)} GPU-h ({line.seconds:,} s)"
        rate = f"{line.rate} {currency}/GPU-h"
        exact = (line.seconds * price / 3600).quantize(Decimal("0.0001"))
        detail.append(f"{line.seconds:,} s \u00d7 {line.rate} {currency}/h = {exact} {currency}")
    if text := evidence_text(line.evidence):
        detail.append(f"evidence: {text}")
    cells = (wording.label(line.kind), time, rate, display(line.amount, currency))
    return DocumentRow(line.kind, cells, tuple(detail))


def gpu_hours(seconds: int) -> str:
    """GPU-hours to four places, or two where that is exact: "96.00", "0.7833", "0.0056"."""
    hours = (Decimal(seconds) / 3600).quantize(Decimal("0.0001"))
    return (
        f"{hours.quantize(Decimal('0.01'))}"
        if hours == hours.quantize(Decimal("0.01"))
        else f"{hours}"
    )


# --- HTML ---------------------------------------------------------------------------------

# Scoped to the document, so the dashboard can show the same fragment inside its own page.
STYLE = """
.invoice-doc { font: 14px/1.45 system-ui, sans-serif; color: #111; }
.invoice-doc h1 { font-size: 1.6rem; margin: 0 0 .5rem; }
.invoice-doc h2 { font-size: .8rem; text-transform: uppercase; color: #555; margin: 0; }
.invoice-doc .parties { display: flex; flex-wrap: wrap; gap: 1rem 3rem; }
.invoice-doc .parties p, .invoice-doc .facts { margin: .25rem 0 0; }
.invoice-doc table { width: 100%; border-collapse: collapse; margin-top: 1rem; }
.invoice-doc th, .invoice-doc td { text-align: left; padding: .35rem .5rem;
  border-bottom: 1px solid #ddd; vertical-align: top; overflow-wrap: anywhere; }
.invoice-doc .num { text-align: right; font-variant-numeric: tabular-nums; }
.invoice-doc .totals { width: auto; margin-left: auto; }
.invoice-doc .totals .step-amount_due td { font-weight: 700; border-bottom: none; }
.invoice-doc .evidence, .invoice-doc .note { color: #555; font-size: 12px; }
.invoice-doc .status { padding: 0 .4rem; border: 1px solid #999; border-radius: 3px;
  font-size: .9rem; font-weight: 400; }
@media (max-width: 40rem) {
  .invoice-doc table.lines thead { display: none; }
  .invoice-doc table.lines tr { display: block; border-bottom: 1px solid #ddd; }
  .invoice-doc table.lines td { display: block; border: none; padding: .1rem 0; text-align: left; }
}
"""


def render_document(doc: InvoiceDocument) -> str:
    """The document as one HTML fragment (``<article class="invoice-doc">``)."""
    rows = "\n".join(_html_row(row) for row in doc.rows)
    totals = "\n".join(
        f'<tr class="step-{t.key}"><td>{_e(t.label)}</td>'
        f'<td class="num" data-api="steps.{_e(t.key)}">{_e(t.amount)}</td></tr>'
        for t in doc.totals
    )
    head = "".join(f'<th scope="col"{_num(i)}>{_e(c)}</th>' for i, c in enumerate(COLUMNS))
    return f"""<article class="invoice-doc">
<h1>{_e(doc.title)} <span class="status">{_e(doc.status)}</span></h1>
<div class="parties">
<section class="seller"><h2>From</h2><p>{_lines(doc.seller)}</p></section>
<section class="bill-to"><h2>Bill to</h2><p>{_lines(doc.bill_to)}</p></section>
</div>
<p class="facts">{_lines(doc.facts)}</p>
<p class="credits">{_e(doc.credits)}</p>
<table class="lines">
<thead><tr>{head}</tr></thead>
<tbody>
{rows}
</tbody>
</table>
<table class="totals">
<tbody>
{totals}
</tbody>
</table>
<p class="note">{_e(doc.note)}</p>
</article>"""


def render_invoice(doc: InvoiceDocument) -> str:
    """The standalone, printable page."""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{_e(doc.title)}</title>
<style>body {{ max-width: 60rem; margin: 2rem auto; padding: 0 1rem; }}
@media print {{ body {{ margin: 0; }} }}{STYLE}</style></head>
<body>
{render_document(doc)}
</body></html>
"""


def _html_row(row: DocumentRow) -> str:
    item, time, rate, amount = (_e(c) for c in row.cells)
    detail = "".join(
        f'<div class="evidence">{_e(d)}</div>' if i else f"<div>{_e(d)}</div>"
        for i, d in enumerate(row.detail)
    )
    return (
        f'<tr class="line-{_e(row.kind)}"><td>{item}</td><td>{detail}</td>'
        f'<td class="num">{time}</td><td class="num">{rate}</td><td class="num">{amount}</td></tr>'
    )


def _lines(texts: tuple[str, ...]) -> str:
    return "<br>".join(_e(t) for t in texts)


def _num(column: int) -> str:
    return ' class="num"' if column >= 2 else ""


def _e(value: object) -> str:
    return escape(str(value), quote=True)
