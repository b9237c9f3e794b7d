"""How an invoice line reads on the dashboard and in the PDF (one wording for both)."""

from __future__ import annotations

from app.billing.html import _KIND_LABELS as KIND_LABELS  # billing's own wording of line kinds
from app.billing.schemas import InvoiceLineRead
from app.dashboard.formatting import Formatter, facts


def label(kind: str) -> str:
    return KIND_LABELS.get(kind, kind)


def detail(line: InvoiceLineRead, fmt: Formatter) -> list[str]:
    """The line's description, then its evidence: which GPU, which event, how long."""
    main = []
    if line.gpu_model:
        main.append(line.gpu_model)
    if line.rental_id:
        main.append(f"rental {str(line.rental_id)[:8]}")
    if line.gpu_uuid:
        main.append(f"GPU {line.gpu_uuid}")
    if line.start_at and line.end_at:
        main.append(f"{fmt.datetime_s(line.start_at)} to {fmt.datetime_s(line.end_at)}")
    if line.voucher_id:
        main.append(f"voucher {line.voucher_id}")
    if line.adjusts_period:
        main.append(f"corrects {line.adjusts_period}")
    out = ["; ".join(main)] if main else []
    if line.evidence:
        out.append(f"evidence: {facts(line.evidence)}")
    return out
