"""How an invoice line reads on the dashboard and in the PDF: billing's wording, local times."""

from __future__ import annotations

from app.billing.schemas import InvoiceLineRead
from app.billing.wording import label, line_facts
from app.dashboard.formatting import Formatter
from app.dashboard.wording import line_evidence

__all__ = ["detail", "label"]


def detail(line: InvoiceLineRead, fmt: Formatter) -> list[str]:
    """The line's description, then its evidence: which GPU, which event, how long."""
    main = line_facts(line, fmt.datetime_s, rental=lambda rental_id: str(rental_id)[:8])
    out = ["; ".join(main)] if main else []
    if line.evidence:
        out.append(f"evidence: {line_evidence(line.evidence)}")
    return out
