"""``gpumeter simulate --scenario``: store a published case's history, then rate it as billing does.

The history is stored once, with automatic failover (hit rentals resume on a hot spare within
``auto_window_s``), and committed. It is then read back and rated by billing's own code:
``what_if`` at 1 h, 1 min and 1 s increments gives both columns. "Automatic" is its "with
credits" column (the invoice: failure and migration seconds credited); "manual" its "without
automatic credits" column, which bills every downtime incident for at least the manual
recovery time (47 min). Effective GPU-hours come from ``effective_usage`` with idle minutes
measured from the stored minute metrics (``idle_by_gpu``), as the usage page measures them.

Minute metrics are stored only for the GPU-hours idle time is read from (``store.hour_rows``):
60 days of 3,000 GPUs would otherwise be 4.5 M rows (~5 GB) that no figure here reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal

from sqlalchemy.orm import Session

import app.models  # noqa: F401 - registers every table, so foreign keys resolve
from app.billing.core.domain import Bucket
from app.billing.core.effective import EffectiveUsage, effective_usage
from app.billing.core.whatif import WhatIfTable, what_if
from app.billing.loader import load_inputs
from app.billing.service import rate
from app.billing.usage import idle_by_gpu
from app.core.db import get_engine, transaction
from app.simulate.attribution import Recovery
from app.simulate.fleet import OneCustomerFleet, create_one_customer_fleet
from app.simulate.progress import Counter, Progress
from app.simulate.run import Options, Report, simulate
from app.simulate.scenarios import DAY, WINDOW_START, Scenario

INCREMENTS = (3600, 60, 1)
DOWNTIME = (Bucket.FAILURE_CREDIT, Bucket.MIGRATION_CREDIT)
IDLE_READ_CHUNK = 256  # GPUs per idle read: a 3,000-GPU month of idle minutes is ~50 M ints


@dataclass(frozen=True, slots=True)
class Replay:
    scenario: Scenario
    gpus: int
    spares: int
    span: tuple[int, int]
    report: Report
    table: WhatIfTable
    usage: EffectiveUsage  # automatic failover: rated at 1 s, idle measured
    buckets: dict[Bucket, int]
    incidents: int  # the rated downtime pieces: failovers, and failures waited out

    @property
    def manual_downtime_s(self) -> int:
        """Seconds the manual column bills for downtime: Σ max(incident, manual recovery)."""
        by_increment = {row.increment_s: row for row in self.table.rows}
        second = by_increment[1]
        return second.without_credits.billed_s - second.with_credits.billed_s

    @property
    def manual_effective_s(self) -> int:
        """Rented - manual downtime - unmeasured - idle: the job waits for a human meanwhile."""
        u = self.usage
        return u.rented_s - self.manual_downtime_s - u.unmeasured_s - u.idle_s

    @property
    def price(self) -> Decimal:
        return Decimal(self.scenario.price_per_hour)


def replay(
    url: str, scenario: Scenario, scale: float, seed: int, progress: Progress, idle_below: int
) -> Replay:
    """``idle_below``: a GPU minute under this utilisation (tenths of a percent) is idle, as
    the usage views measure it (``UsageSettings.idle_below_tenths``)."""
    gpus = scenario.scaled(scale)
    span = (WINDOW_START, WINDOW_START + scenario.days * DAY)
    engine = get_engine(url)
    with transaction(engine) as session:
        fleet, report = _store(session, scenario, gpus, span, seed, progress, idle_below)
        progress.say("- committing ...")
    with transaction(engine) as session:
        return _rate(session, scenario, fleet, span, report, progress, idle_below)


def _store(
    session: Session,
    scenario: Scenario,
    gpus: int,
    span: tuple[int, int],
    seed: int,
    progress: Progress,
    idle_below: int,
) -> tuple[OneCustomerFleet, Report]:
    tag = f"{scenario.name}-s{seed}"
    with progress.step(f"creating {tag}: one customer renting {gpus:,} GPUs, hot spares"):
        fleet = create_one_customer_fleet(
            session, gpus, scenario.model, scenario.price_per_hour, *span, tag
        )
    options = Options(
        start=span[0],
        end=span[1],
        failure_rate=float(scenario.failures_per_gpu_day),
        recovery=Recovery.AUTO,
        manual_recovery_s=scenario.manual_recovery_s,
        seed=seed,
        auto_window_s=scenario.auto_window_s,
        idle_share=float(scenario.idle_share),
        idle_rows_below_tenths=idle_below,
    )
    return fleet, simulate(session, fleet.gpus, options, progress)


def _rate(
    session: Session,
    scenario: Scenario,
    fleet: OneCustomerFleet,
    span: tuple[int, int],
    report: Report,
    progress: Progress,
    idle_below: int,
) -> Replay:
    customer = fleet.customer_id
    with progress.step("loading rentals, assignments, migrations and segments"):
        inputs = load_inputs(session, [customer], span)
    with progress.step("rating at 1 h, 1 min and 1 s, with and without automatic credits"):
        table = what_if(
            inputs.for_customer(customer, span),
            increments=INCREMENTS,
            manual_recovery_s=scenario.manual_recovery_s,
        )
        [rated] = rate(inputs, customer)  # the plan's own 1 s increment: the invoice
    counter = progress.counter("idle minutes, GPUs", len(inputs.gpus))
    with progress.step("measuring idle minutes from the stored minute metrics"):
        idle = _idle(session, inputs.gpus, span, counter, idle_below)
        usage = effective_usage(rated, idle)
    incidents = sum(1 for p in rated.pieces if p.bucket in DOWNTIME)
    return Replay(
        scenario,
        fleet.rented,
        fleet.spares,
        span,
        report,
        table,
        usage,
        dict(rated.buckets),
        incidents,
    )


def _idle(
    session: Session,
    gpus: Sequence[str],
    span: tuple[int, int],
    counter: Counter,
    idle_below: int,
) -> dict[str, list[tuple[int, int]]]:
    idle: dict[str, list[tuple[int, int]]] = {}
    for i in range(0, len(gpus), IDLE_READ_CHUNK):
        chunk = gpus[i : i + IDLE_READ_CHUNK]
        idle.update(idle_by_gpu(session, chunk, span, idle_below))
        counter.add(len(chunk))
    return idle
