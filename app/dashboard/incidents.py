"""Incidents: each failure of a GPU while the customer rented it, as one readable record.

A failure is a state change to ``failed`` on a GPU during (or ending) one of the customer's
assignments. It is paired with the first migration off that GPU at or after it (the
orchestrator's "moved to GPU Y, resumed at t"), and with the credit lines of the period's
invoice for that GPU over the incident; before the invoice run has drafted one, with the credit
lines of the period rated to date, marked as an estimate (the live incident shows what it will
be credited, not a promise to credit it later). A migration
with no failure event on record is an incident of its own.

What is measured, and what is not: the failure second comes from the node; "reported after"
is when the service received that event (``received_at``), so it includes the agent's upload
delay and, for back-filled history, the whole backfill delay. How long the node took to notice
the failure is not recorded, so it is never shown as a number. Neither is in the customer's
summary, which says what happened in their words: the cause (``wording.cause``, never a rule
name), where the rental went (moved, being moved by a failover in progress, waiting for a
spare, staying on its repaired GPU) and the credit; internal ids stay in the API's fields.

A failure the service acted on (a failover, ``app.failover``) carries its timeline: failed (the
first failed second, per telemetry), detected (the service learned of it), requested (a spare
reserved and the orchestrator asked), resumed (the job runs on the spare), credited (the
invoice's credit lines over the incident). The times are the failover's own, as its API gives
them; "after" counts from the failed second.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from enum import StrEnum
from typing import Any

from pydantic import Field
from sqlalchemy.orm import Session

from app.billing import usage as billing_usage
from app.billing.core.lines import LineKind
from app.billing.loader import BillingPeriod
from app.billing.models import InvoiceLineRow
from app.billing.schemas import money
from app.billing.usage import UsageSettings
from app.core.epoch import epoch, from_epoch
from app.core.schemas import Schema
from app.customers.models import Customer
from app.dashboard import exports, rental_labels, wording
from app.dashboard.formatting import Formatter, duration
from app.failover import reads as failover_reads
from app.failover.models import Failover, FailoverState
from app.metering import reads as metering_reads
from app.rentals.models import Migration
from app.rentals.reads import served
from app.rentals.service import customer_migrations

MAX_INCIDENTS = 1000  # per period: a page lists them all; a fleet-wide storm is cut here
BACKFILLED_AFTER_S = 3600  # a failure the service learned of later than this came from history
_CREDIT_KINDS = {LineKind.FAILURE_CREDIT, LineKind.MIGRATION_CREDIT}


class TimelineStep(Schema):
    step: str  # failed, detected, requested, resumed, credited
    at: datetime | None
    after_s: float | None = Field(description="Seconds after the first failed second.")
    after: str | None = Field(description="after_s for a person: 0.4 s, 3 min 5 s.")
    text: str


class FailoverTimeline(Schema):
    failover_id: uuid.UUID
    state: str
    spare_gpu_uuid: str | None
    steps: list[TimelineStep]


class Outcome(StrEnum):
    """Where the rental went after the failure."""

    MOVED = "moved"  # running on another GPU
    MOVING = "moving"  # a failover is moving it now
    WAITING = "waiting"  # no spare was free: credited until the GPU is repaired
    REPAIRED = "repaired"  # the failed GPU was repaired and serves the rental again
    NOT_MOVED = "not_moved"  # stayed on its GPU (no failover, or it did not complete)


class IncidentRead(Schema):
    gpu_uuid: str
    rental_id: uuid.UUID
    rental_name: str  # its name, else what it rents and when (``app.dashboard.rental_labels``)
    failed_at: datetime
    cause: str  # ``wording.cause``: what a customer reads
    evidence: str  # the node's own words: "XID 79: GPU has fallen off the bus"
    outcome: Outcome
    event_id: str | None
    reported_after_s: int | None  # None: no failure event on record
    moved_to_gpu: str | None
    migration_id: int | None
    resumed_at: datetime | None
    downtime_s: int | None  # failure to resumption on the new GPU
    credited: str | None  # None: nothing rated for the period yet
    credited_s: int | None
    # The rental's other GPUs, credited while the failure stalled its job (``stall_credit``).
    stall_credited: str | None = None
    stall_credited_s: int | None = None
    credit_estimated: bool = False  # rated to date: no invoice drafted for the period yet
    failover: FailoverTimeline | None = None  # None: the service opened no failover for it
    summary: str


@dataclass(frozen=True)
class _Failure:
    gpu_uuid: str
    rental_id: uuid.UUID
    at: int
    cause: str
    evidence: str
    event_id: str | None
    received_s: int | None


def latest_events(
    session: Session,
    customer_id: uuid.UUID,
    lo: int,
    hi: int,
    limit: int,
    *,
    failures_only: bool = False,
) -> list[dict[str, Any]]:
    """Newest first: events of [lo, hi) on GPUs during (or ending) the customer's assignments."""
    held = served(customer_id=customer_id, start=from_epoch(lo), end=from_epoch(hi)).subquery()
    return metering_reads.events_while_held(
        session, held, lo, hi, limit, failures_only=failures_only
    )


def incidents(
    session: Session,
    customer: Customer,
    period: BillingPeriod,
    now: datetime,
    fmt: Formatter,
    config: UsageSettings,
) -> list[IncidentRead]:
    """``config``: how the period to date is rated for a credit before the invoice."""
    lo, hi = period.span[0], min(period.span[1], epoch(now))
    events = latest_events(session, customer.id, lo, hi, MAX_INCIDENTS, failures_only=True)
    failures = [_failure(e) for e in reversed(events)]  # oldest first
    migrations = customer_migrations(session, customer.id, from_epoch(lo), from_epoch(hi))
    invoice = exports.find_invoice(session, customer, period)
    failovers = {
        (fo.rental_id, fo.failed_gpu_uuid, epoch(fo.failed_at)): fo
        for fo in failover_reads.failovers_of(session, customer.id, lo, hi, MAX_INCIDENTS)
    }
    pairs = _pair(failures, migrations)
    names = rental_labels.labels(session, customer.id, {f.rental_id for f, _ in pairs}, fmt)
    credits = _Credits(invoice.lines, False) if invoice is not None else None
    if credits is None and pairs:  # the period so far, rated as the invoice will rate it
        rated = billing_usage.lines_to_date(session, customer, period, now, config)
        credits = _Credits(rated, True)
    return [
        _read(
            f,
            m,
            failovers.get((f.rental_id, f.gpu_uuid, f.at)),
            credits,
            names.get(f.rental_id, str(f.rental_id)),
            fmt,
        )
        for f, m in pairs
    ]


@dataclass(frozen=True)
class _Credits:
    """The credit lines an incident's credit is read from: the invoice's, or rated to date."""

    lines: Sequence[InvoiceLineRow]
    estimated: bool


def _failure(event: dict[str, Any]) -> _Failure:
    facts = {"code": event["code"], "rule": event["rule"], "detail": event["detail"]}
    return _Failure(
        event["gpu_uuid"],
        event["rental_id"],
        event["at"],
        wording.cause(event["code"], event["rule"]),
        wording.evidence(facts),
        event["event_id"],
        event["received_s"],
    )


def _pair(
    failures: list[_Failure], migrations: Iterable[Migration]
) -> list[tuple[_Failure, Migration | None]]:
    """Each failure with the first unpaired migration off its GPU at or after it; migrations
    left over become incidents of their own (their reason is the cause)."""
    left = list(migrations)
    pairs: list[tuple[_Failure, Migration | None]] = []
    for failure in failures:
        match = next(
            (
                m
                for m in left
                if m.from_gpu_uuid == failure.gpu_uuid
                and m.rental_id == failure.rental_id
                and epoch(m.failed_at) >= failure.at
            ),
            None,
        )
        if match is not None:
            left.remove(match)
        pairs.append((failure, match))
    for m in left:
        reason = m.reason or ""
        moved = _Failure(
            m.from_gpu_uuid, m.rental_id, epoch(m.failed_at), reason, reason, None, None
        )
        pairs.append((moved, m))
    return sorted(pairs, key=lambda p: p[0].at)


def _read(
    f: _Failure,
    m: Migration | None,
    fo: Failover | None,
    credits: _Credits | None,
    rental_name: str,
    fmt: Formatter,
) -> IncidentRead:
    resumed = None if m is None else epoch(m.resumed_at)
    credited, credited_s = (None, None) if credits is None else _credited(credits, f, resumed)
    stalled, stalled_s = (None, None) if credits is None else _stall_credited(credits, f, resumed)
    read = IncidentRead(
        gpu_uuid=f.gpu_uuid,
        rental_id=f.rental_id,
        rental_name=rental_name,
        failed_at=from_epoch(f.at),
        cause=f.cause,
        evidence=f.evidence,
        outcome=_outcome(m, fo),
        event_id=f.event_id,
        reported_after_s=None if f.received_s is None else max(0, f.received_s - f.at),
        moved_to_gpu=None if m is None else m.to_gpu_uuid,
        migration_id=None if m is None else m.id,
        resumed_at=None if resumed is None else from_epoch(resumed),
        downtime_s=None if resumed is None else resumed - f.at,
        credited=None if credited is None else money(credited, fmt.currency),
        credited_s=credited_s,
        stall_credited=None if stalled is None else money(stalled, fmt.currency),
        stall_credited_s=stalled_s,
        credit_estimated=credits is not None and credits.estimated,
        summary="",
    )
    read.summary = _summary(f, read, fo, fmt)
    # A failover opened only after the job already ran elsewhere (history sent late) did not
    # move it: its timeline would tell another story than the migration.
    if fo is not None and (resumed is None or epoch(fo.detected_at) < resumed):
        read.failover = _timeline(fo, read, fmt)
    return read


def _outcome(m: Migration | None, fo: Failover | None) -> Outcome:
    if m is not None:
        return Outcome.MOVED
    if fo is None:
        return Outcome.NOT_MOVED
    return _FAILOVER_OUTCOMES.get(fo.state, Outcome.NOT_MOVED)


_FAILOVER_OUTCOMES = {
    FailoverState.REQUESTED: Outcome.MOVING,
    FailoverState.NO_SPARE: Outcome.WAITING,
    FailoverState.RECOVERED: Outcome.REPAIRED,
}


def _credited(credits: _Credits, f: _Failure, resumed: int | None) -> tuple[Decimal, int]:
    """The credit lines for this GPU that start within the incident (failure to resumption):
    their amount (positive) and seconds."""
    return _summed(
        line
        for line in _within(credits, f, resumed)
        if line.kind in _CREDIT_KINDS and line.gpu_uuid == f.gpu_uuid
    )


def _stall_credited(
    credits: _Credits, f: _Failure, resumed: int | None
) -> tuple[Decimal | None, int | None]:
    """The rental's other GPUs' stall credit lines this failure began (None: none)."""
    amount, seconds = _summed(
        line
        for line in _within(credits, f, resumed)
        if line.kind == LineKind.STALL_CREDIT
        and line.rental_id == f.rental_id
        and (line.evidence or {}).get("stalled_by") == f.gpu_uuid
    )
    return (amount, seconds) if seconds else (None, None)


def _within(credits: _Credits, f: _Failure, resumed: int | None) -> Iterable[InvoiceLineRow]:
    """The credit lines that start within the incident (failure to resumption)."""
    until = f.at + 1 if resumed is None else max(resumed, f.at + 1)
    return (
        line
        for line in credits.lines
        if line.start_at is not None and f.at <= epoch(line.start_at) < until
    )


def _summed(lines: Iterable[InvoiceLineRow]) -> tuple[Decimal, int]:
    """Credit lines' amount (positive) and seconds."""
    amount, seconds = Decimal(0), 0
    for line in lines:
        amount -= line.amount
        seconds += line.seconds or 0
    return amount, seconds


def _after(fo: Failover, at: datetime) -> float:
    """Seconds from the failover's first failed second to ``at``, to a tenth."""
    return round((at - fo.failed_at).total_seconds(), 1)


def _timeline(fo: Failover, incident: IncidentRead, fmt: Formatter) -> FailoverTimeline:
    """The failover's steps, each with its time and how long after the failed second."""

    backfilled = _after(fo, fo.detected_at) > BACKFILLED_AFTER_S

    def step(name: str, at: datetime, text: str) -> TimelineStep:
        after = _after(fo, at)
        spoken = f"{after:g} s" if after < 60 else duration(int(after))
        # Late history: "after 57 d" would read as our reaction time; the times say enough.
        shown = None if backfilled and name != "failed" else spoken
        return TimelineStep(step=name, at=at, after_s=after, after=shown, text=text)

    spare = fo.spare_gpu_uuid
    requested = f"spare GPU {spare} reserved, your job is being moved" if spare else _no_spare()
    detected = (
        "we learned of it later, from the node's records"
        if backfilled
        else ("we detected the failure")
    )
    steps = [
        step("failed", fo.failed_at, f"{fo.failed_gpu_uuid} failed"),
        step("detected", fo.detected_at, detected),
        step("requested", fo.requested_at, requested),
    ]
    if fo.resumed_at is not None:
        steps.append(step("resumed", fo.resumed_at, f"your job runs again on {spare}"))
    if incident.credited is not None:
        credit = f"{fmt.money(incident.credited)} for {duration(incident.credited_s or 0)}"
        if incident.credit_estimated:
            credit += " so far (an estimate until the invoice is drafted)"
        steps.append(TimelineStep(step="credited", at=None, after_s=None, after=None, text=credit))
    return FailoverTimeline(
        failover_id=fo.id, state=str(fo.state), spare_gpu_uuid=spare, steps=steps
    )


def _no_spare() -> str:
    return "no spare GPU was free: the time is credited until the GPU is repaired"


def _summary(f: _Failure, i: IncidentRead, fo: Failover | None, fmt: Formatter) -> str:
    """The incident in the customer's words: what failed and why, where the rental went,
    the credit."""
    when = fmt.datetime_s(f.at)
    if f.event_id is None:  # a migration with no failure on record: the move is the incident
        head = f"{f.gpu_uuid} was replaced {when}" + (f" ({f.cause})" if f.cause else "")
    else:
        head = f"{f.gpu_uuid} failed {when}: {f.cause}"
    spare = None if fo is None else fo.spare_gpu_uuid
    where = {
        Outcome.MOVED: f"Moved to {i.moved_to_gpu}, running again after "
        f"{duration(i.downtime_s or 0)}",
        Outcome.MOVING: f"Failover in progress: moving to spare GPU {spare}",
        Outcome.WAITING: f"Waiting for a GPU: {_no_spare()}",
        Outcome.REPAIRED: f"{f.gpu_uuid} was repaired and runs your job again",
        Outcome.NOT_MOVED: "Not moved to another GPU: the failed time is credited",
    }[i.outcome]
    if i.credited is None:
        credit = "Credit: on this month's invoice once it is drafted"
    elif i.credit_estimated:
        credit = (
            f"Estimated credit so far {fmt.money(i.credited)} for "
            f"{duration(i.credited_s or 0)}, on this month's invoice once it is drafted"
        )
    else:
        credit = f"Credited {fmt.money(i.credited)}"
    if i.stall_credited is not None:
        estimated = "estimated so far " if i.credit_estimated else ""
        credit += (
            f", and {estimated}{fmt.money(i.stall_credited)} for your rental's other GPUs while "
            f"the job waited ({duration(i.stall_credited_s or 0)} of GPU time)"
        )
    return f"{head}. {where}. {credit}"
