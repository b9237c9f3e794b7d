"""The invoice document (``app.billing.html.invoice_document``) as a PDF (fpdf2, pure Python):
the same texts as its HTML, in the same order, drawn on A4.

Layout is done here, a line at a time: words are wrapped by the core font's widths and each
line is written with one text operator. fpdf2's table and multi_cell lay text out a character
at a time, which took 2.6 s for the 650 lines of a 3,000-GPU customer's month; this takes a
tenth of that (``bench/dashboard.py``'s ``invoice_pdf``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from app.billing.html import COLUMNS, InvoiceDocument

if TYPE_CHECKING:
    from fpdf import FPDF

# The core PDF fonts speak cp1252 (it has €, £, ¥); anything else prints as "?".
_ENCODING = "windows-1252"
_FONT = "helvetica"
_MARGIN = 12.0  # mm
_WIDTHS = (30.0, 86.0, 22.0, 22.0, 26.0)  # mm: item, detail, time, rate, amount (186 in all)
_PAD = 1.2  # mm inside each cell
_LINE = 3.9  # mm per line of table text
_SIZE = 8.0  # pt, table text


def render(doc: InvoiceDocument) -> bytes:
    # Imported here: fpdf2 and its fontTools take 0.4 s to import, a cost every service,
    # worker and CLI process would pay at start for the few requests that want a PDF.
    from fpdf import FPDF

    pdf = FPDF(format="A4")
    pdf.core_fonts_encoding = _ENCODING
    pdf.set_margins(_MARGIN, _MARGIN, _MARGIN)
    pdf.set_auto_page_break(False)
    pdf.set_title(_safe(doc.title))
    pdf.set_author(_safe(doc.seller[0]))
    pdf.add_page()
    page = _Page(pdf)
    page.header(doc)
    page.table(doc)
    page.totals(doc)
    page.paragraph((doc.note,), 7.5, color=90)
    return bytes(pdf.output())


def _safe(text: str) -> str:
    return text.encode(_ENCODING, "replace").decode(_ENCODING)


class _Page:
    """A cursor down the page that writes wrapped lines and starts a new page when full."""

    def __init__(self, pdf: FPDF) -> None:
        self.pdf = pdf
        self.y = _MARGIN
        self.bottom = pdf.h - _MARGIN
        self.width = pdf.w - 2 * _MARGIN
        self.font(9.5)

    def font(self, size: float, bold: bool = False, color: int = 17) -> None:
        from fpdf.fonts import CORE_FONTS_CHARWIDTHS

        style = "B" if bold else ""
        self.pdf.set_font(_FONT, style, size)
        self.pdf.set_text_color(color)
        self.widths = CORE_FONTS_CHARWIDTHS[_FONT + style]

    def room(self, height: float) -> None:
        if self.y + height > self.bottom:
            self.pdf.add_page()
            self.y = _MARGIN

    def width_of(self, text: str) -> float:
        """``text``'s width in mm at the current core font, from its character widths (what
        ``FPDF.get_string_width`` computes, without copying the graphics state each call)."""
        widths, glyphs = self.widths, text.encode(_ENCODING).decode("latin-1")  # as fpdf2 does
        return sum(widths[c] for c in glyphs) * self.pdf.font_size_pt * 0.001 / self.pdf.k

    def write(self, x: float, y: float, text: str, width: float, right: bool = False) -> None:
        """One line of the current font whose top is at ``y``."""
        if right:
            x += width - self.width_of(text)
        self.pdf.text(x, y + self.pdf.font_size * 0.85, text)

    def wrap(self, text: str, width: float) -> list[str]:
        """``text`` in lines no wider than ``width`` at the current font: broken between words,
        and inside a word only when the word alone is wider."""
        space = self.width_of(" ")
        lines, used = [""], 0.0
        for word in _safe(text).split(" "):
            size = self.width_of(word)
            if not lines[-1] and size <= width:
                lines[-1], used = word, size
            elif lines[-1] and used + space + size <= width:
                lines[-1], used = f"{lines[-1]} {word}", used + space + size
            else:
                pieces = list(self._cut(word, width))
                lines[-1:] = [lines[-1], *pieces] if lines[-1] else pieces
                used = self.width_of(lines[-1])
        return lines

    def _cut(self, word: str, width: float) -> Iterator[str]:
        piece, used = "", 0.0
        for char in word:
            size = self.width_of(char)
            if piece and used + size > width:
                yield piece
                piece, used = "", 0.0
            piece, used = piece + char, used + size
        yield piece

    def paragraph(
        self, texts: Sequence[str], size: float, bold: bool = False, color: int = 17
    ) -> None:
        self.font(size, bold, color)
        height = size * 0.45
        for text in texts:
            for line in self.wrap(text, self.width):
                self.room(height)
                self.write(_MARGIN, self.y, line, self.width)
                self.y += height
        self.y += 1.5

    def header(self, doc: InvoiceDocument) -> None:
        self.font(16, bold=True)
        title = _safe(doc.title)
        self.write(_MARGIN, self.y, title, self.width)
        status_x = _MARGIN + self.pdf.get_string_width(title) + 4
        self.font(10, color=90)
        self.write(status_x, self.y + 1.5, doc.status, 40)
        self.y += 9
        top, half = self.y, self.width / 2
        for x, heading, texts in ((0.0, "From", doc.seller), (half, "Bill to", doc.bill_to)):
            self.y = top
            self.font(7.5, bold=True, color=90)
            self.write(_MARGIN + x, self.y, heading, half)
            self.y += 4
            self.font(9.5)
            for text in texts:
                for line in self.wrap(text, half - 4):
                    self.write(_MARGIN + x, self.y, line, half)
                    self.y += 4.4
        self.y = max(self.y, top) + 3
        self.paragraph(doc.facts, 9.5)
        self.paragraph((doc.credits,), 9.5)

    def table(self, doc: InvoiceDocument) -> None:
        self.font(_SIZE, bold=True)
        self.room(2 * _LINE + 2 * _PAD)
        self.pdf.set_fill_color(235, 238, 242)
        self.pdf.rect(_MARGIN, self.y, self.width, _LINE + 2 * _PAD, style="F")
        self._cells([[c] for c in COLUMNS])
        self.font(_SIZE)
        for row in doc.rows:
            item, time, rate, amount = row.cells
            cells = [
                self.wrap(item, _WIDTHS[0] - 2 * _PAD),
                [line for d in row.detail for line in self.wrap(d, _WIDTHS[1] - 2 * _PAD)],
                [time],
                [rate],
                [amount],
            ]
            self.room(max(len(c) for c in cells) * _LINE + 2 * _PAD)
            self._cells(cells)

    def _cells(self, cells: list[list[str]]) -> None:
        x = _MARGIN
        for column, (lines, width) in enumerate(zip(cells, _WIDTHS, strict=True)):
            for n, line in enumerate(lines):
                y = self.y + _PAD + n * _LINE
                self.write(x + _PAD, y, _safe(line), width - 2 * _PAD, right=column >= 2)
            x += width
        self.y += max(len(c) for c in cells) * _LINE + 2 * _PAD
        self.pdf.set_draw_color(221)
        self.pdf.line(_MARGIN, self.y, _MARGIN + self.width, self.y)

    def totals(self, doc: InvoiceDocument) -> None:
        self.y += 2
        label_w, amount_w = 60.0, 32.0
        x = _MARGIN + self.width - label_w - amount_w
        for total in doc.totals:
            last = total.key == "amount_due"
            self.font(10.5 if last else 9.5, bold=last)
            self.room(5.5)
            self.write(x, self.y, _safe(total.label), label_w)
            self.write(x + label_w, self.y, _safe(total.amount), amount_w, right=True)
            self.y += 5.5
        self.y += 2
