"""Simulate a fleet's history over a window: failures, migrations, segments, minute metrics.

Used by ``gpumeter simulate`` (on a synthetic fleet it creates) and by the demo (on the demo
provider's GPUs). One transaction: the caller commits.
"""

from __future__ import annotations

import logging
import random
import time
from collections import defaultdict
from dataclasses import asdict, dataclass

from sqlalchemy.orm import Session

from app.fleet.service import RENTAL_GPUS
from app.plans.service import RENTAL_PLANS
from app.rentals.ports import Catalogue
from app.rentals.service import use_catalogue
from app.simulate import store
from app.simulate.attribution import (
    AUTO_WINDOW_S,
    Recovery,
    load_ledger,
    migrate_failures,
    resume_delay,
)
from app.simulate.history import SimGpu, failure_events, plan_failures, state_runs
from app.simulate.progress import Progress
from app.simulate.telemetry import HOUR

log = logging.getLogger(__name__)
DEFAULT_FAILURE_RATE = 0.0072  # per GPU per day


@dataclass(frozen=True, slots=True)
class Options:
    start: int  # epoch seconds, inclusive
    end: int  # exclusive
    failure_rate: float = DEFAULT_FAILURE_RATE
    recovery: Recovery = Recovery.AUTO
    manual_recovery_s: int = 47 * 60
    seed: int = 0
    auto_window_s: tuple[int, int] = AUTO_WINDOW_S  # failover to a spare, seconds
    idle_share: float = store.DEFAULT_IDLE_SHARE  # of rented GPU-hours
    # Store only the minute metrics idle time is read from (see ``store.hour_rows``).
    idle_rows_below_tenths: int | None = None


@dataclass(frozen=True, slots=True)
class Report:
    gpus: int
    gpu_hours: int
    failures: int
    migrations: int
    segments: int
    events: int
    metric_rows: int
    seconds: float

    def as_dict(self) -> dict[str, int | float]:
        return asdict(self)


def simulate(session: Session, gpus: list[SimGpu], options: Options, progress: Progress) -> Report:
    began = time.monotonic()
    # The simulator is its own composition root: its migrations check GPUs as the API's do.
    use_catalogue(Catalogue(RENTAL_GPUS, RENTAL_PLANS))
    rng = random.Random(options.seed)
    gpus = sorted(gpus, key=lambda g: g.uuid)  # closed hours are copied in key order
    start, end = options.start, options.end
    with progress.step(f"planning failures ({options.failure_rate:.2%} per GPU-day)"):
        failures = plan_failures(gpus, start, end, options.failure_rate, rng)
        delays = [
            resume_delay(options.recovery, options.manual_recovery_s, rng, options.auto_window_s)
            for _ in failures
        ]
    with progress.step(f"migrating hit rentals to spares ({options.recovery} recovery)"):
        ledger = load_ledger(session, [g.uuid for g in gpus], start)
        migrations = migrate_failures(session, gpus, failures, end, delays, ledger)
    by_gpu = defaultdict(list)
    for f in failures:
        by_gpu[f.gpu_uuid].append(f)
    runs = {g.uuid: state_runs(by_gpu[g.uuid], start, end) for g in gpus}
    events = [e for g in gpus for f in by_gpu[g.uuid] for e in failure_events(g, f, end)]
    with progress.step("writing state segments and health events"):
        store.write_history(session, runs, events)
        store.touch(session, gpus, runs, end)
    hours = len(range(start - start % HOUR, end, HOUR))
    counter = progress.counter("minute metrics, GPUs", len(gpus))
    kept = "" if options.idle_rows_below_tenths is None else ", storing the idle ones"
    with progress.step(f"writing minute metrics ({len(gpus) * hours:,} GPU-hours{kept})"):
        rows = (
            row
            for g in gpus
            for row in store.hour_rows(
                g,
                runs[g.uuid],
                _rented(ledger.held[g.uuid]),
                rng,
                options.idle_share,
                options.idle_rows_below_tenths,
            )
        )
        metric_rows = store.write_metrics(session, rows, counter)
    report = Report(
        gpus=len(gpus),
        gpu_hours=round(len(gpus) * (end - start) / HOUR),
        failures=len(failures),
        migrations=migrations,
        segments=sum(len(r) for r in runs.values()),
        events=len(events),
        metric_rows=metric_rows,
        seconds=round(time.monotonic() - began, 1),
    )
    log.info("simulated", extra=report.as_dict())
    return report


def _rented(held: list) -> list[tuple[int, int]]:
    return [(h.start, h.end) for h in held]
