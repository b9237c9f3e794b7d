"""The Stripe mirror's job on the queue: drain the outbox.

The outbox (``stripe_outbox``) stays the source of truth, with its leases, steps and backoff;
the job only runs ``sync_due``. Finalizing or voiding an invoice defers it at once (in that
transaction); a periodic run picks up rows whose backoff has passed and anything a crash left.
At most one run waits at a time (its queueing lock); several may run, the leases keep them off
each other's invoices.
"""

from __future__ import annotations

import procrastinate
from procrastinate import job_context
from sqlalchemy.orm import Session

from app.core.queue import defer
from app.payments.stripe_api import make_client
from app.payments.stripe_mirror import sync_due

tasks = procrastinate.Blueprint()
QUEUEING_LOCK = "stripe_sync"


@tasks.periodic(cron="* * * * * */15")
@tasks.task(name="sync_stripe", queueing_lock=QUEUEING_LOCK, pass_context=True)
def sync_stripe(context: job_context.JobContext, timestamp: int | None = None) -> int:
    """Mirror every due outbox row; how many were worked (0 with Stripe off)."""
    settings = context.additional_context["settings"]
    if not settings.stripe_api_key:
        return 0
    return sync_due(context.additional_context["engine"], make_client(settings), settings)


def wake_sync(session: Session) -> None:
    """Have a worker run the sync once this transaction commits."""
    defer(session, sync_stripe, queueing_lock=QUEUEING_LOCK)
