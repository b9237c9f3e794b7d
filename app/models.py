"""Every table's model, imported in one place for Alembic and the model/migration check."""

from app.auth.models import ApiKey, KeyKind, SignedOutSession
from app.balances.models import BalanceEntry
from app.billing.models import Invoice, InvoiceLineRow, InvoiceNumberCounter, VoucherEntryRow
from app.budgets.models import Budget, BudgetCrossing
from app.core.base import Base
from app.core.idempotency import IdempotencyKey
from app.customers.models import Customer
from app.events.models import DomainEvent
from app.failover.models import Failover, SparePolicy
from app.fleet.models import Gpu, MaintenanceWindow, Node, Pool
from app.metering.models import HealthEventRow, MinuteMetrics, OpenMinuteMetrics, StateSegment
from app.payments.models import PaymentFailure, StripeOutbox, StripeWebhookEvent
from app.plans.models import PlanPrice, PricePlan
from app.rentals.models import GpuAssignment, Migration, Rental
from app.schedule.models import ScheduledRun
from app.slurm.models import SlurmAccount, SlurmAction, SlurmJob
from app.webhooks.models import WebhookAttempt, WebhookDelivery, WebhookEndpoint

__all__ = [
    "ApiKey",
    "BalanceEntry",
    "Base",
    "Budget",
    "BudgetCrossing",
    "Customer",
    "DomainEvent",
    "Failover",
    "Gpu",
    "GpuAssignment",
    "HealthEventRow",
    "IdempotencyKey",
    "Invoice",
    "InvoiceLineRow",
    "InvoiceNumberCounter",
    "KeyKind",
    "MaintenanceWindow",
    "Migration",
    "MinuteMetrics",
    "Node",
    "OpenMinuteMetrics",
    "PaymentFailure",
    "PlanPrice",
    "Pool",
    "PricePlan",
    "Rental",
    "ScheduledRun",
    "SignedOutSession",
    "SlurmAccount",
    "SlurmAction",
    "SlurmJob",
    "SparePolicy",
    "StateSegment",
    "StripeOutbox",
    "StripeWebhookEvent",
    "VoucherEntryRow",
    "WebhookAttempt",
    "WebhookDelivery",
    "WebhookEndpoint",
]
