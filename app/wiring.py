"""The composition root: which package reacts to which domain event, which jobs the queue runs.

Domain packages publish events without knowing their listeners and declare their tasks on
their own blueprints; only this module (called by the app factory, the worker and the CLI
commands that change invoices) connects them, so the layers stay acyclic (billing never
imports payments).
"""

from __future__ import annotations

from collections.abc import Callable

import procrastinate
from sqlalchemy.orm import Session

from app.balances.service import grant_trial_credit
from app.billing.usage import UsageSettings
from app.budgets.service import refuse_rental_over_hard_limit
from app.core import idempotency, reactions
from app.core import queue as job_queue
from app.customers.models import Customer
from app.customers.service import add_created_hook
from app.events import stream
from app.events.models import DomainEvent
from app.events.service import ALL_TYPES, subscribe
from app.failover import degraded as failover_degraded
from app.failover import jobs as failover_jobs
from app.failover.service import (
    FailoverSettings,
    add_move_check,
    on_gpu_state_changed,
    refuse_reserved_spares,
)
from app.fleet.service import RENTAL_GPUS
from app.metering import retention, summaries
from app.payments import jobs as payments_jobs
from app.payments.service import StripeSettings, on_invoice_event
from app.plans.service import RENTAL_PLANS
from app.rentals.ports import Catalogue
from app.rentals.service import add_assign_check, add_create_check, use_catalogue
from app.schedule import jobs as schedule_jobs
from app.settings import get_settings
from app.slurm import service as slurm
from app.webhooks import jobs as webhook_jobs
from app.webhooks.service import on_event as deliver_to_webhooks

BLUEPRINTS: dict[str, procrastinate.Blueprint] = {
    "queue": job_queue.core_tasks,
    "payments": payments_jobs.tasks,
    "webhooks": webhook_jobs.tasks,
    "invoice_schedule": schedule_jobs.tasks,
    "nats": stream.tasks,
    "failover": failover_jobs.tasks,
    "failover_degraded": failover_degraded.tasks,  # degraded GPUs migrated (issue 42)
    "metering": retention.tasks,  # telemetry partitions (issue 17)
    "metering_summaries": summaries.tasks,  # closed hours deflated after the hour's turn
    "idempotency": idempotency.tasks,  # expired Idempotency-Keys purged
}


def install() -> None:
    """Register every subscriber and every task; calling it again changes nothing."""
    subscribe("invoice.finalized", _mirror_to_stripe)
    subscribe("invoice.voided", _mirror_to_stripe)
    subscribe(ALL_TYPES, deliver_to_webhooks)
    use_catalogue(Catalogue(RENTAL_GPUS, RENTAL_PLANS))
    add_create_check(_refuse_rental_over_hard_limit)
    # The failure loop: a rented GPU turning failed opens a failover; reserved spares are
    # refused to new assignments.
    subscribe("gpu.state_changed", _open_failovers)
    add_assign_check(refuse_reserved_spares)
    # A Slurm job's failover is carried out by the Slurm adapter (one Slurm cannot requeue is
    # abandoned before a spare is reserved); after the failover's own subscriber, so a
    # repaired GPU's pool is settled before its node's is.
    add_move_check(slurm.requeue_refusal)
    subscribe("failover.requested", slurm.on_failover_requested)
    subscribe("failover.resumed", slurm.on_failover_resumed)
    subscribe("gpu.state_changed", _resume_repaired_slurm_nodes)
    add_created_hook(_grant_trial_credit)
    if get_settings().nats_url:
        subscribe(ALL_TYPES, stream.queue_publication)
    for namespace, blueprint in BLUEPRINTS.items():
        if not any(name.startswith(f"{namespace}:") for name in job_queue.queue.tasks):
            job_queue.queue.add_tasks_from(blueprint, namespace=namespace)


# Subscribers given the settings they follow, read as each event comes (so a changed setting
# applies without a restart of the wiring).


def _open_failovers(session: Session, event: DomainEvent) -> None:
    on_gpu_state_changed(session, event, FailoverSettings.of(get_settings()))


def _mirror_to_stripe(session: Session, event: DomainEvent) -> None:
    on_invoice_event(session, event, StripeSettings.of(get_settings()))


def _resume_repaired_slurm_nodes(session: Session, event: DomainEvent) -> None:
    slurm.on_gpu_state_changed(session, event, get_settings().spare_target_percent)


def _grant_trial_credit(session: Session, customer: Customer) -> None:
    grant_trial_credit(session, customer, get_settings().trial_credit)


def _refuse_rental_over_hard_limit(session: Session, customer: Customer) -> None:
    refuse_rental_over_hard_limit(session, customer, UsageSettings.of(get_settings()))


# --- the "who reacts to what" table (docs/reactions.md) --------------------------------------

REACTIONS_COMMAND = "python -m app.wiring --reactions > docs/reactions.md"


def _published(event_type: str) -> str:
    return "any event is published" if event_type == ALL_TYPES else f"`{event_type}` is published"


# What sets off the handlers each registrar of ``install`` registers.
TRIGGERS: dict[str, Callable[..., str]] = {
    subscribe.__name__: _published,
    add_create_check.__name__: lambda: "a rental is about to be created (may refuse it)",
    add_assign_check.__name__: lambda: "GPUs are about to be assigned to rentals (may refuse them)",
    add_created_hook.__name__: lambda: "a customer is created",
    add_move_check.__name__: lambda: "a failover is about to reserve a spare (may abandon it)",
}


def reactions_table() -> str:
    """docs/reactions.md: each subscriber and hook ``install`` registers, in order, and the
    jobs on a schedule."""
    registered = reactions.registrations(install, TRIGGERS, BLUEPRINTS)
    return reactions.render(registered, reactions.periodic(BLUEPRINTS), REACTIONS_COMMAND)


if __name__ == "__main__":
    import sys

    if sys.argv[1:] != ["--reactions"]:
        sys.exit(f"usage: {REACTIONS_COMMAND}")
    sys.stdout.write(reactions_table())
