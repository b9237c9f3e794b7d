"""The composition root: which package reacts to which domain event.

Domain packages publish events without knowing their listeners; only this module (called by
the app factory, the worker and the CLI commands that change invoices) connects them, so the
layers stay acyclic (billing never imports payments).
"""

from __future__ import annotations

from app.budgets.service import refuse_rental_over_hard_limit
from app.events.service import subscribe
from app.payments.service import on_invoice_event
from app.rentals.service import add_create_check


def install() -> None:
    """Register every in-process subscriber; calling it again changes nothing."""
    subscribe("invoice.finalized", on_invoice_event)
    subscribe("invoice.voided", on_invoice_event)
    add_create_check(refuse_rental_over_hard_limit)
