"""The product on one machine: `simulate` (a synthetic fleet's history, or a published
scenario's cost table) and `demo`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from app.cli.common import (
    PORT,
    Group,
    bounded_int,
    command,
    database_url,
    number_above,
    positive_seconds,
)
from app.cli.server import exit_cleanly_on_sigterm
from app.core.logging import configure_logging
from app.settings import get_settings


def cmd_simulate(args: argparse.Namespace) -> int:
    from app.billing.usage import UsageSettings
    from app.core import migrate
    from app.simulate.attribution import Recovery
    from app.simulate.command import print_report, replay_scenario, simulate_fleet
    from app.simulate.progress import Progress

    progress = Progress()
    if args.scenario is not None:
        fleet_options = ("gpus", "days", "failure_rate", "recovery")
        if given := [f"--{o.replace('_', '-')}" for o in fleet_options if getattr(args, o)]:
            print(
                f"{', '.join(given)}: not with --scenario (its inputs are fixed)", file=sys.stderr
            )
            return 2
        exit_cleanly_on_sigterm()  # so the scenario's database is dropped
        with database_url(args.data_dir) as url:
            return replay_scenario(
                url,
                args.scenario,
                scale=args.scale,
                seed=args.seed,
                keep=args.keep,
                progress=progress,
                idle_below=UsageSettings.of(get_settings()).idle_below_tenths,
            )
    with database_url(args.data_dir) as url:
        migrate.upgrade(url)
        report = simulate_fleet(
            url,
            args.gpus or 3000,
            args.days or 30,
            failure_rate=0.0072 if args.failure_rate is None else args.failure_rate,
            recovery=Recovery(args.recovery or "auto"),
            manual_recovery_s=get_settings().manual_recovery_s,
            seed=args.seed,
            progress=progress,
        )
    print_report(report, progress)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    if not args.verbose:  # the terminal shows progress; the demo's logs go to demo.log
        configure_logging("warning")
    from app.demo.run import DemoOptions, run_demo

    options = DemoOptions(
        data_dir=args.data_dir,
        duration=args.duration,
        port=args.port,
        fail_after_s=args.fail_after,
        restart_s=args.restart_after,
        verbose=args.verbose,
    )
    return run_demo(options, database_url)


def add_simulate(commands: Group) -> None:
    simulate = command(
        commands,
        "simulate",
        cmd_simulate,
        "write a synthetic fleet's history (rentals, telemetry, failures), or replay a "
        "published scenario and print its cost table",
    )
    simulate.add_argument(
        "--gpus", type=bounded_int(1, 1_000_000), default=None, help="GPUs to create (default 3000)"
    )
    simulate.add_argument(
        "--days",
        type=number_above(0),
        default=None,
        help="days of history, ending now (default 30)",
    )
    simulate.add_argument(
        "--failure-rate",
        type=number_above(0, or_equal=True),
        default=None,
        help="failures per GPU per day (default 0.0072)",
    )
    simulate.add_argument(
        "--recovery",
        choices=["auto", "manual"],
        default=None,
        help="auto: hit rentals move to a spare within seconds; manual: after "
        "GPUMETER_MANUAL_RECOVERY_S (default auto)",
    )
    simulate.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    simulate.add_argument(
        "--scenario",
        choices=["seed", "llama3"],
        default=None,
        help="replay a published case in a new database and print, rated by billing, its cost "
        "at 1 h / 1 min / 1 s increments with manual and automatic failover: 'seed' (3,000 "
        "A100 for 60 days; ~4 min on a loaded 2-core VM) or 'llama3' (16,384 H100 for 54 "
        "days, 419 interruptions; ~19 min at scale 1, 2.5 min at --scale 0.25). Not with "
        "--gpus, --days, --failure-rate, --recovery",
    )
    simulate.add_argument(
        "--scale",
        type=number_above(0),
        default=1.0,
        help="with --scenario: GPUs x this (rates and days kept; default 1)",
    )
    simulate.add_argument(
        "--keep",
        action="store_true",
        help="with --scenario: keep its database and print its URL (default: dropped)",
    )


def add_demo(commands: Group) -> None:
    demo = command(
        commands,
        "demo",
        cmd_demo,
        "the whole product on this machine: service, agents with a scripted GPU failure, "
        "a backfilled month, invoices, the dashboard",
        database=False,
    )
    demo.add_argument(
        "--duration",
        type=number_above(0),
        default=None,
        help="seconds to run once ready, then print the summary and exit (default: until Ctrl-C)",
    )
    demo.add_argument(
        "--port", type=bounded_int(*PORT), default=8000, help="port to serve on (default 8000)"
    )
    demo.add_argument(
        "--fail-after",
        type=positive_seconds,
        default=20,
        help="seconds after the agents start that the scripted GPU fails (default 20)",
    )
    demo.add_argument(
        "--restart-after",
        type=positive_seconds,
        default=20,
        help="seconds the orchestrator takes to resume the job on the spare: the credited "
        "migration window (default 20)",
    )
    demo.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="keep the demo's database, logs and spools here (default: a temporary directory, "
        "removed at exit)",
    )
    demo.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="stream the demo's and its processes' JSON logs to the terminal (default: into "
        "demo.log, server.log and agent-*.log in the data directory)",
    )
