"""The composition root: which package reacts to which domain event, which jobs the queue runs.

Domain packages publish events without knowing their listeners and declare their tasks on
their own blueprints; only this module (called by the app factory, the worker and the CLI
commands that change invoices) connects them, so the layers stay acyclic (billing never
imports payments).
"""

from __future__ import annotations

import procrastinate

from app.core import queue as job_queue
from app.events.service import subscribe
from app.payments import jobs as payments_jobs
from app.payments.service import on_invoice_event

BLUEPRINTS: dict[str, procrastinate.Blueprint] = {
    "queue": job_queue.core_tasks,
    "payments": payments_jobs.tasks,
}


def install() -> None:
    """Register every subscriber and every task; calling it again changes nothing."""
    subscribe("invoice.finalized", on_invoice_event)
    subscribe("invoice.voided", on_invoice_event)
    for namespace, blueprint in BLUEPRINTS.items():
        if not any(name.startswith(f"{namespace}:") for name in job_queue.queue.tasks):
            job_queue.queue.add_tasks_from(blueprint, namespace=namespace)
