"""Operator views: the fleet now (by model and datacenter) and revenue by month.

Fleet: every GPU's pool and last reported state (``gpus.last_state``, kept by ingest), and
whether a rental holds it now; failures in the last 24 h with what is measured about each:
``reported after`` (the event's ``received_at`` minus its second: upload delay, not the node's
own detection time, which is not recorded) and ``resumed after`` (failure to the rental's
resumption on its new GPU, when a migration followed within a day). The spares ready and
their target per model and datacenter are the spare pool's (one source: the failover policy).

Failover latency: the failover package's own p50/p99 per datacenter and model: detection
(first failed second to the service knowing), request and resume, where a failover measured it.

Spare pool: each datacenter and model's hot spares now (available, reserved, preemptibly
rented, target) and the spare GPU-hours sold preemptibly this UTC month, as the failover
package counts them (``GET /v1/spare-pool`` gives the same).

Revenue: per month and currency, the sums of the non-void invoices' lines by kind.
"""

from __future__ import annotations

import statistics
import uuid
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from pydantic import Field
from sqlalchemy.orm import Session

from app.billing import reads as billing_reads
from app.billing import usage as billing_usage
from app.billing.core.lines import LineKind
from app.billing.loader import billing_period, current_period
from app.billing.models import InvoiceLineRow
from app.billing.schemas import money
from app.billing.usage import UsageSettings
from app.core.epoch import epoch, from_epoch
from app.core.schemas import Schema
from app.customers import reads as customers_reads
from app.customers.service import customers_by_zone
from app.dashboard import wording
from app.failover.schemas import SiteLatency, SparePoolRead
from app.failover.service import pool_view
from app.failover.service import summary as failover_summary
from app.fleet import reads as fleet_reads
from app.metering import reads as metering_reads
from app.rentals import reads as rentals_reads

FAILURE_WINDOW_S = 86_400
MAX_FAILURES = 500


class FleetGroup(Schema):
    model: str
    datacenter: str
    gpus: int
    by_pool: dict[str, int]
    by_state: dict[str, int]
    rented: int
    spare_ready: int = Field(description="The spare pool's available GPUs (GET /v1/spare-pool).")
    spare_target: int = Field(description="The spare pool's target (the failover policy).")
    failures_24h: int


class FailureRead(Schema):
    gpu_uuid: str
    model: str
    datacenter: str
    at: datetime
    cause: str
    reported_after_s: int | None
    moved_to_gpu: str | None
    resumed_after_s: int | None


class LatencyRead(Schema):
    count: int
    median_s: float | None
    max_s: int | None


class FleetRead(Schema):
    at: datetime
    groups: list[FleetGroup]
    failures_24h: list[FailureRead]
    reported_after: LatencyRead
    resumed_after: LatencyRead
    spare_pools: list[SparePoolRead]
    failover_latency: list[SiteLatency] = Field(
        description="Per datacenter and model, from the failovers: detection (first failed "
        "second -> the service knows), request and resume p50/p99 (GET /v1/failovers/summary)."
    )


def fleet(session: Session, now: datetime, spare_target: Decimal) -> FleetRead:
    """``spare_target``: the ``spare_target_percent`` setting (a pool with no policy)."""
    until = epoch(now)
    failures = _failures(session, until - FAILURE_WINDOW_S, until + 1)
    per_group: defaultdict[tuple[str, str], int] = defaultdict(int)
    for f in failures:
        per_group[(f.model, f.datacenter)] += 1
    pools = _spare_pools(session, now, spare_target)
    return FleetRead(
        at=now,
        groups=_groups(fleet_reads.fleet_counts(session), per_group, pools),
        failures_24h=failures,
        reported_after=_latency([f.reported_after_s for f in failures]),
        resumed_after=_latency([f.resumed_after_s for f in failures]),
        spare_pools=pools,
        failover_latency=failover_summary(session).sites,
    )


def _spare_pools(session: Session, now: datetime, spare_target: Decimal) -> list[SparePoolRead]:
    """This UTC month to now (at least a second: the pool view wants a window)."""
    start = now.astimezone(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    return pool_view(session, start, max(now, start + timedelta(seconds=1)), spare_target)


def _groups(
    rows: list[dict[str, object]],
    failures: dict[tuple[str, str], int],
    pools: list[SparePoolRead],
) -> list[FleetGroup]:
    spares = {(p.model, p.datacenter): p for p in pools}
    grouped: dict[tuple[str, str], list[dict[str, object]]] = defaultdict(list)
    for row in rows:
        grouped[(str(row["model"]), str(row["datacenter"]))].append(row)
    out = []
    for (model, dc), items in sorted(grouped.items()):
        by_pool: defaultdict[str, int] = defaultdict(int)
        by_state: defaultdict[str, int] = defaultdict(int)
        rented = 0
        for r in items:
            n = int(r["gpus"])  # type: ignore[call-overload]
            by_pool[str(r["pool"])] += n
            by_state[str(r["state"])] += n
            rented += n if r["rented"] else 0
        pool = spares.get((model, dc))
        out.append(
            FleetGroup(
                model=model,
                datacenter=dc,
                gpus=sum(by_pool.values()),
                by_pool=dict(by_pool),
                by_state=dict(by_state),
                rented=rented,
                spare_ready=0 if pool is None else pool.available,
                spare_target=0 if pool is None else pool.target,
                failures_24h=failures.get((model, dc), 0),
            )
        )
    return out


def _failures(session: Session, since: int, until: int) -> list[FailureRead]:
    """Failures since ``since``, each with its GPU's place and, when a rental was moved off
    the GPU after it, when that rental resumed on its new GPU."""
    rows = metering_reads.failures_between(session, since, until, MAX_FAILURES)
    places = fleet_reads.gpu_places(session, {row["gpu_uuid"] for row in rows})
    moves = rentals_reads.moved_after(session, [(r["gpu_uuid"], r["at"]) for r in rows])
    failures = []
    for row in rows:
        model, datacenter = places[row["gpu_uuid"]]
        resumed_s, to_gpu = moves.get((row["gpu_uuid"], row["at"]), (None, None))
        failures.append(
            _failure(
                row
                | {"model": model, "datacenter": datacenter}
                | {"resumed_s": resumed_s, "to_gpu_uuid": to_gpu}
            )
        )
    return failures


def _failure(row: dict[str, object]) -> FailureRead:
    at = int(row["at"])  # type: ignore[call-overload]
    received, resumed = row["received_s"], row["resumed_s"]
    return FailureRead(
        gpu_uuid=str(row["gpu_uuid"]),
        model=str(row["model"]),
        datacenter=str(row["datacenter"]),
        at=from_epoch(at),
        cause=wording.evidence({"code": row["code"], "rule": row["rule"], "detail": row["detail"]}),
        reported_after_s=None if received is None else max(0, int(received) - at),  # type: ignore[call-overload]
        moved_to_gpu=None if row["to_gpu_uuid"] is None else str(row["to_gpu_uuid"]),
        resumed_after_s=None if resumed is None else int(resumed) - at,  # type: ignore[call-overload]
    )


def _latency(values: list[int | None]) -> LatencyRead:
    known = [v for v in values if v is not None]
    return LatencyRead(
        count=len(known),
        median_s=statistics.median(known) if known else None,
        max_s=max(known) if known else None,
    )


# --- revenue ------------------------------------------------------------------------------


class RevenueFigures(Schema):
    invoices: int
    billed: str = Field(description="GPU time charged, before credits.")
    credited: str = Field(description="Failure, migration and degraded credits (negative).")
    cap_reductions: str
    adjustments: str
    vouchers: str
    tax: str
    total: str = Field(description="Invoiced, tax included: every column before it.")
    prepaid: str = Field(description="Paid from customers' prepaid balances (negative).")
    amount_due: str = Field(description="Total + prepaid: what the invoices ask to be paid.")
    to_date: bool = Field(
        default=False,
        description="Includes a current month rated to date, with no invoice drafted yet "
        "(charges, credits and caps; vouchers, tax and the prepaid balance come with it).",
    )


class RevenueCustomer(RevenueFigures):
    customer_id: uuid.UUID
    customer_name: str


class RevenueMonth(RevenueFigures):
    period: str
    currency: str
    customers: list[RevenueCustomer] = Field(
        description="The month's figures per customer, largest total first; they add up to "
        "the month's."
    )


class RevenueRead(Schema):
    first: str
    last: str
    months: list[RevenueMonth]


_COLUMNS = {
    LineKind.CHARGE: "billed",
    LineKind.FAILURE_CREDIT: "credited",
    LineKind.MIGRATION_CREDIT: "credited",
    LineKind.DEGRADED_CREDIT: "credited",
    LineKind.STALL_CREDIT: "credited",
    LineKind.CAP: "cap_reductions",
    LineKind.ADJUSTMENT: "adjustments",
    LineKind.CREDIT_NOTE: "adjustments",  # the part of negative adjustments credited apart
    LineKind.VOUCHER: "vouchers",
    LineKind.TAX: "tax",
    LineKind.PREPAID_BALANCE: "prepaid",
}
_ALL = set(_COLUMNS.values())
_INVOICED = _ALL - {"prepaid"}


def revenue(
    session: Session, first: str, last: str, now: datetime, config: UsageSettings
) -> RevenueRead:
    """Per month and currency, and per customer: the non-void invoices' lines; a customer's
    current month with no invoice yet is rated to date (``to_date``)."""
    sums: dict[tuple[str, str], dict[uuid.UUID, dict[str, Decimal]]] = defaultdict(dict)
    invoices: dict[tuple[str, str, uuid.UUID], int] = {}
    for row in billing_reads.revenue_by_period(session, first, last):
        month, customer = (str(row["period"]), str(row["currency"])), row["customer_id"]
        cells = sums[month].setdefault(customer, defaultdict(Decimal))
        key = (*month, customer)
        invoices[key] = max(invoices.get(key, 0), int(row["invoices"]))
        cells[_COLUMNS[LineKind(row["kind"])]] += row["amount"]
    to_date = _to_date(session, first, last, now, config)
    for (month, customer), lines in to_date.items():
        cells = sums[month].setdefault(customer, defaultdict(Decimal))
        invoices.setdefault((*month, customer), 0)
        for line in lines:
            cells[_COLUMNS[LineKind(line.kind)]] += line.amount
    names = customer_names(session, {c for per in sums.values() for c in per})
    months = []
    for (period, currency), per_customer in sorted(sums.items(), reverse=True):
        customers = [
            RevenueCustomer(
                customer_id=customer,
                customer_name=names.get(customer, str(customer)),
                to_date=((period, currency), customer) in to_date,
                **_figures(cells, invoices[(period, currency, customer)], currency),
            )
            for customer, cells in per_customer.items()
        ]
        customers.sort(key=lambda c: (-Decimal(c.total), c.customer_name))
        whole: dict[str, Decimal] = defaultdict(Decimal)
        for cells in per_customer.values():
            for column, amount in cells.items():
                whole[column] += amount
        count = sum(c.invoices for c in customers)
        months.append(
            RevenueMonth(
                period=period,
                currency=currency,
                customers=customers,
                to_date=any(c.to_date for c in customers),
                **_figures(whole, count, currency),
            )
        )
    return RevenueRead(first=first, last=last, months=months)


def _to_date(
    session: Session, first: str, last: str, now: datetime, config: UsageSettings
) -> dict[tuple[tuple[str, str], uuid.UUID], list[InvoiceLineRow]]:
    """Each customer's current month, where it lies in [first, last] and the invoice run has
    not drafted it, rated to date (the lines its invoice would start from)."""
    out = {}
    for customer in customers_by_zone(session):
        name = current_period(customer.billing_timezone, now)
        if not first <= name <= last or billing_reads.live_invoice(session, customer.id, name):
            continue
        period = billing_period(name, customer.billing_timezone)
        lines = billing_usage.lines_to_date(session, customer, period, now, config)
        if lines:
            out[(name, customer.currency), customer.id] = lines
    return out


def customer_names(session: Session, ids: set[uuid.UUID]) -> dict[uuid.UUID, str]:
    if not ids:
        return {}
    return {id_: name for id_, name in session.execute(customers_reads.names_query(ids))}


def _figures(cells: dict[str, Decimal], invoices: int, currency: str) -> dict[str, Any]:
    fields: dict[str, Any] = {column: money(cells[column], currency) for column in _ALL}
    # Total is what was invoiced; the prepaid balance is how part of it was paid.
    total = sum((cells[column] for column in _INVOICED), Decimal(0))
    fields.update(
        invoices=invoices,
        total=money(total, currency),
        amount_due=money(total + cells["prepaid"], currency),
    )
    return fields
