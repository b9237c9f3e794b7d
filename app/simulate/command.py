"""``gpumeter simulate``: a synthetic fleet and its history, in one transaction."""

from __future__ import annotations

import json
import random
import secrets
import time

import app.models  # noqa: F401 - registers every table, so foreign keys resolve
from app.core.db import get_engine, transaction
from app.simulate.attribution import Recovery
from app.simulate.fleet import create_fleet
from app.simulate.history import DAY
from app.simulate.progress import Progress
from app.simulate.run import Options, Report, simulate


def simulate_fleet(
    url: str,
    gpus: int,
    days: float,
    *,
    failure_rate: float,
    recovery: Recovery,
    manual_recovery_s: int,
    seed: int,
    progress: Progress,
) -> Report:
    """Create ``gpus`` GPUs with rentals and write ``days`` of history ending this minute."""
    end = int(time.time()) // 60 * 60
    options = Options(
        start=end - round(days * DAY),
        end=end,
        failure_rate=failure_rate,
        recovery=recovery,
        manual_recovery_s=manual_recovery_s,
        seed=seed,
    )
    tag = secrets.token_hex(3)  # names of this run's nodes, plan and customers
    with transaction(get_engine(url)) as session:
        with progress.step(f"creating fleet sim-{tag}: {gpus:,} GPUs, customers, rentals"):
            fleet = create_fleet(session, gpus, options.start, end, random.Random(seed), tag)
        report = simulate(session, fleet.gpus, options, progress)
        progress.say("- committing ...")
    return report


def print_report(report: Report, progress: Progress) -> None:
    progress.say(
        f"simulated {report.gpus:,} GPUs over {report.gpu_hours:,} GPU-hours in "
        f"{report.seconds} s: {report.failures} failures, {report.migrations} migrations, "
        f"{report.segments:,} segments, {report.events:,} health events, "
        f"{report.metric_rows:,} GPU-hour metric rows (total {progress.elapsed:.1f} s)"
    )
    print(json.dumps({**report.as_dict(), "total_seconds": round(progress.elapsed, 1)}))


def replay_scenario(
    url: str,
    name: str,
    *,
    scale: float,
    seed: int,
    keep: bool,
    progress: Progress,
    idle_below: int,
) -> int:
    """Replay scenario ``name`` in a database of its own on ``url``'s server; print its table
    (``idle_below``: ``replay.replay``'s)."""
    from app.core.scratch_db import scratch_database
    from app.simulate.replay import replay
    from app.simulate.replay_report import print_replay
    from app.simulate.scenarios import SCENARIOS

    scenario = SCENARIOS[name]
    progress.say(f"- creating and migrating a database for scenario {name} ...")
    with scratch_database(url, f"gpumeter_scenario_{name}", keep=keep) as scratch:
        result = replay(scratch, scenario, scale, seed, progress, idle_below)
        if keep:
            progress.say(f"  kept the scenario's database: {scratch}")
    print_replay(result, scale, seed, print)
    progress.say(f"scenario {name} replayed in {progress.elapsed:.1f} s")
    return 0
