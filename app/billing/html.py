"""A printable, standalone HTML invoice: server-side, every value escaped, no external assets."""

from __future__ import annotations

from datetime import datetime
from html import escape

from app.billing import wording
from app.billing.core.evidence import evidence_text
from app.billing.schemas import InvoiceLineRead, InvoiceRead
from app.customers.models import Customer
from app.settings import get_settings

_STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; color: #111; max-width: 60rem; margin: 2rem auto; }
h1 { font-size: 1.6rem; margin: 0 0 .25rem; }
table { width: 100%; border-collapse: collapse; margin-top: 1.5rem; }
th, td { text-align: left; padding: .35rem .5rem; border-bottom: 1px solid #ddd;
  vertical-align: top; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tfoot td { font-weight: 600; border-bottom: none; }
.meta { color: #555; } .evidence { color: #555; font-size: 12px; }
.status { display: inline-block; padding: 0 .4rem; border: 1px solid #999; border-radius: 3px; }
@media print { body { margin: 0; } }
"""


def render_invoice(invoice: InvoiceRead, customer: Customer) -> str:
    """The seller, the customer, the dates (due from the customer's payment terms), the lines
    (tax once, as a percentage, in the totals), and what was credited."""
    title = invoice.number or f"Draft {invoice.period}"
    rows = "\n".join(_row(line) for line in invoice.lines if line.kind != "tax")
    credits = wording.credits_summary(invoice.lines)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>Invoice {_e(title)}</title><style>{_STYLE}</style></head>
<body>
<h1>Invoice {_e(title)} <span class="status">{_e(invoice.status.value)}</span></h1>
{_seller()}
<p class="meta">Bill to: {_e(customer.name)}{_email(customer)}<br>
Period {_e(invoice.period)} ({_e(invoice.timezone)}):
{_e(_when(invoice.period_start))} to {_e(_when(invoice.period_end))}<br>
{_dates(invoice)}</p>
<p class="credits">{_e(credits.text)}</p>
<table>
<thead><tr><th>Item</th><th>Detail</th><th class="num">Seconds</th><th class="num">Rate</th>
<th class="num">Amount ({_e(invoice.currency)})</th></tr></thead>
<tbody>
{rows}
</tbody>
<tfoot>
<tr><td colspan="4">Subtotal</td><td class="num">{_e(invoice.subtotal)}</td></tr>
<tr><td colspan="4">Tax {_e(wording.percent(invoice.tax_rate))}</td>
<td class="num">{_e(invoice.tax)}</td></tr>
<tr><td colspan="4">Total</td><td class="num">{_e(invoice.total)}</td></tr>
</tfoot>
</table>
<p class="meta">Amounts are rounded once per line to the currency's minor unit (half up);
the total is the sum of the lines. GPU time is billed per second.</p>
</body></html>
"""


def _row(line: InvoiceLineRead) -> str:
    seconds = "" if line.seconds is None else f"{line.seconds:,}"
    return (
        f"<tr><td>{_e(wording.label(line.kind))}</td><td>{_detail(line)}</td>"
        f'<td class="num">{seconds}</td><td class="num">{_e(line.rate or "")}</td>'
        f'<td class="num">{_e(line.amount)}</td></tr>'
    )


def _detail(line: InvoiceLineRead) -> str:
    detail = _e(", ".join(wording.line_facts(line, _when)))
    if text := evidence_text(line.evidence):
        detail += f'<div class="evidence">evidence: {_e(text)}</div>'
    return detail


def _seller() -> str:
    settings = get_settings()
    parts = [f"<strong>{_e(settings.seller_name)}</strong>"]
    parts += [_e(line) for line in settings.seller_address.splitlines() if line.strip()]
    if settings.seller_tax_id:
        parts.append(f"Tax id: {_e(settings.seller_tax_id)}")
    return f'<p class="seller">{"<br>".join(parts)}</p>'


def _email(customer: Customer) -> str:
    return f" &lt;{_e(customer.email)}&gt;" if customer.email else ""


def _dates(invoice: InvoiceRead) -> str:
    dates = [
        ("Generated", invoice.generated_at),
        ("Finalized", invoice.finalized_at),
        ("Due", invoice.due_at),
        ("Paid", invoice.paid_at),
        ("Voided", invoice.voided_at),
    ]
    text = " &middot; ".join(f"{label} {_e(_when(at))}" for label, at in dates if at)
    if invoice.void_reason:
        text += f" &middot; reason: {_e(invoice.void_reason)}"
    return text


def _when(at: datetime) -> str:
    return at.strftime("%Y-%m-%d %H:%M:%S %Z")


def _e(value: object) -> str:
    return escape(str(value), quote=True)
