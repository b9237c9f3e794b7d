"""The invoice as a PDF (fpdf2, pure Python): number, lines, credits with evidence, vouchers,
tax and totals, with the same wording and amounts as the dashboard's invoice page."""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.billing.schemas import InvoiceRead
from app.customers.models import Customer
from app.dashboard import invoices
from app.dashboard.formatting import Formatter, duration

if TYPE_CHECKING:
    from fpdf import FPDF

# The core PDF fonts speak cp1252 (it has €, £, ¥); anything else prints as "?".
_ENCODING = "windows-1252"
_WIDTHS = (30, 90, 28, 32)  # mm: item, detail, time, amount


def render(invoice: InvoiceRead, customer: Customer, fmt: Formatter) -> bytes:
    # Imported here: fpdf2 and its fontTools take 0.4 s to import, a cost every service,
    # worker and CLI process would pay at start for the few requests that want a PDF.
    from fpdf import FPDF

    pdf = FPDF(format="A4")
    pdf.core_fonts_encoding = _ENCODING
    pdf.set_title(_safe(f"Invoice {_title(invoice)}"))
    pdf.set_author("gpumeter")
    pdf.add_page()
    _header(pdf, invoice, customer, fmt)
    _lines(pdf, invoice, fmt)
    _totals(pdf, invoice, fmt)
    return bytes(pdf.output())


def _title(invoice: InvoiceRead) -> str:
    return invoice.number or f"draft {invoice.period}"


def _safe(text: str) -> str:
    return text.encode(_ENCODING, "replace").decode(_ENCODING)


def _header(pdf: FPDF, invoice: InvoiceRead, customer: Customer, fmt: Formatter) -> None:
    pdf.set_font("helvetica", "B", 18)
    pdf.cell(0, 10, _safe(f"Invoice {_title(invoice)}"), new_x="LMARGIN", new_y="NEXT")
    pdf.set_font("helvetica", "", 10)
    facts = [
        f"Status: {invoice.status.value}",
        f"Customer: {customer.name}" + (f" <{customer.email}>" if customer.email else ""),
        f"Period: {invoice.period} ({invoice.timezone}), {fmt.datetime(invoice.period_start)}"
        f" to {fmt.datetime(invoice.period_end)}",
        f"Currency: {invoice.currency}",
    ]
    if invoice.finalized_at:
        facts.append(f"Issued: {fmt.datetime(invoice.finalized_at)}")
    for line in facts:
        pdf.cell(0, 5.5, _safe(line), new_x="LMARGIN", new_y="NEXT")
    pdf.ln(4)


def _lines(pdf: FPDF, invoice: InvoiceRead, fmt: Formatter) -> None:
    from fpdf.fonts import FontFace

    pdf.set_font("helvetica", "", 9)
    heading = FontFace(emphasis="BOLD", fill_color=(235, 238, 242))
    with pdf.table(
        col_widths=_WIDTHS,
        text_align=("LEFT", "LEFT", "RIGHT", "RIGHT"),
        headings_style=heading,
        line_height=4.6,
    ) as table:
        table.row(["Item", "Detail", "Time", "Amount"])
        for line in invoice.lines:
            detail = "\n".join(invoices.detail(line, fmt))
            if line.rate is not None:
                rate = f"rate {line.rate}" if line.kind == "tax" else f"{line.rate} per GPU-hour"
                detail = f"{detail}\n{rate}" if detail else rate
            time = duration(line.seconds) if line.seconds is not None else ""
            cells = [invoices.label(line.kind), detail, time, fmt.money(line.amount)]
            table.row([_safe(c) for c in cells])


def _totals(pdf: FPDF, invoice: InvoiceRead, fmt: Formatter) -> None:
    pdf.ln(3)
    label_w, amount_w = sum(_WIDTHS[:3]), _WIDTHS[3]
    for label, amount, bold in (
        ("Subtotal", invoice.subtotal, False),
        (f"Tax ({invoice.tax_rate})", invoice.tax, False),
        ("Total", invoice.total, True),
    ):
        pdf.set_font("helvetica", "B" if bold else "", 11 if bold else 10)
        pdf.cell(label_w, 7, _safe(label), align="R")
        pdf.cell(amount_w, 7, _safe(fmt.money(amount)), align="R", new_x="LMARGIN", new_y="NEXT")
