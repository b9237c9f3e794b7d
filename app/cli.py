"""`gpumeter`: run the service and administer it. Every command has --help."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from app.core.logging import configure_logging
from app.settings import embedded_secret_key, get_settings


@contextmanager
def database_url(data_dir: Path | None) -> Iterator[str]:
    """The configured Postgres URL, or an embedded Postgres started for the command's duration."""
    settings = get_settings()
    if settings.database_url:
        yield settings.database_url
        return
    from app.core.embedded_pg import embedded_postgres

    with embedded_postgres(data_dir or settings.data_dir) as url:
        yield url


def _add_data_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="embedded Postgres data directory, used when GPUMETER_DATABASE_URL is unset "
        f"(default: {get_settings().data_dir})",
    )


def exit_cleanly_on_sigterm() -> None:
    """Turn SIGTERM into a normal exit, so `finally` blocks (stopping the embedded Postgres) run.

    uvicorn re-raises the signal that stopped it once it has shut down; with Python's default
    SIGTERM action the process would die right there, leaving Postgres running.
    """
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))


CONNECTIONS_PER_WORKER = 2048


def ensure_secret_key(data_dir: Path | None) -> bool:
    """Give the workers a signing secret: the configured one, or for the embedded single-box
    default one generated once in the data dir. False: a configured database without one."""
    settings = get_settings()
    if settings.secret_key:
        return True
    if settings.database_url:
        print(
            "gpumeter serve: GPUMETER_SECRET_KEY is not set; it signs portal links and session "
            "cookies. Set it to a long random value, the same for every instance, e.g. "
            "`python3 -c 'import secrets; print(secrets.token_urlsafe(32))'`",
            file=sys.stderr,
        )
        return False
    os.environ["GPUMETER_SECRET_KEY"] = embedded_secret_key(data_dir or settings.data_dir)
    get_settings.cache_clear()
    return True


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from app.core import migrate
    from app.core.limits import BoundedHttpToolsProtocol

    if not ensure_secret_key(args.data_dir):
        return 2
    exit_cleanly_on_sigterm()
    with database_url(args.data_dir) as url:
        migrate.upgrade(url)
        # Workers are separate processes: they read the URL from the environment.
        os.environ["GPUMETER_DATABASE_URL"] = url
        if args.no_worker:
            os.environ["GPUMETER_WORKER_IN_PROCESS"] = "false"
        get_settings.cache_clear()
        settings = get_settings()
        uvicorn.run(
            "app.main:app_from_environment",
            factory=True,
            host=args.host,
            port=args.port,
            workers=args.workers,
            log_config=None,
            access_log=False,
            # Slow, oversized and idle connections are closed (headers: BoundedHttpToolsProtocol;
            # bodies: app.core.limits); shedding is the app's (JSON 503), this is only a hard cap.
            http=BoundedHttpToolsProtocol,
            timeout_keep_alive=settings.keep_alive_s,
            limit_concurrency=CONNECTIONS_PER_WORKER,
            timeout_graceful_shutdown=settings.shutdown_timeout_s,
        )
    return 0


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    from app.core import migrate

    with database_url(args.data_dir) as url:
        migrate.upgrade(url, args.revision)
    print(f"database migrated to {args.revision}")
    return 0


def cmd_create_key(args: argparse.Namespace) -> int:
    from app.auth.models import KeyKind
    from app.auth.service import issue_key
    from app.core.db import get_engine, transaction

    kind = KeyKind(args.kind)
    owner = {KeyKind.CUSTOMER: ("--customer", args.customer), KeyKind.NODE: ("--node", args.node)}
    if kind in owner and owner[kind][1] is None:
        print(
            f"gpumeter admin create-key: --kind {kind.value} needs {owner[kind][0]} ID",
            file=sys.stderr,
        )
        return 2
    with database_url(args.data_dir) as url, transaction(get_engine(url)) as session:
        issued = issue_key(session, kind, args.name, customer_id=args.customer, node_id=args.node)
    print(issued.secret)
    print(
        f"# {kind.value} key {issued.key.id} ({args.name}); it is shown only this once",
        file=sys.stderr,
    )
    return 0


def cmd_simulate(args: argparse.Namespace) -> int:
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


def cmd_stripe_sync(args: argparse.Namespace) -> int:
    from app.core.db import get_engine
    from app.payments.stripe_api import make_client
    from app.payments.stripe_mirror import sync_due

    settings = get_settings()
    if not settings.stripe_api_key:
        print("GPUMETER_STRIPE_API_KEY is not set: the Stripe mirror is off", file=sys.stderr)
        return 2
    with database_url(args.data_dir) as url:
        worked = sync_due(get_engine(url), make_client(settings), settings)
    print(f"{worked} invoice(s) worked")
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    import asyncio

    from prometheus_client import start_http_server

    from app.core import migrate
    from app.core.db import get_engine
    from app.core.queue import run_worker
    from app.wiring import install

    if args.concurrency is not None:
        os.environ["GPUMETER_WORKER_CONCURRENCY"] = str(args.concurrency)
        get_settings.cache_clear()
    install()
    with database_url(args.data_dir) as url:
        migrate.upgrade(url)
        if args.metrics_port is not None:
            start_http_server(args.metrics_port, addr=args.metrics_host)
        # SIGTERM/SIGINT: stop taking jobs, give running ones worker_shutdown_s, then exit.
        engine, name = get_engine(url), f"worker-{os.getpid()}"
        asyncio.run(run_worker(engine, get_settings(), name=name, stop_on_signals=True))
    return 0


def cmd_invoices_run(args: argparse.Namespace) -> int:
    from app.billing.progress import ProgressBar
    from app.billing.run import as_of_time, run_invoices
    from app.billing.service import BillingSettings
    from app.core.db import get_engine, transaction
    from app.core.errors import ApiError
    from app.wiring import install as install_subscribers

    install_subscribers()  # finalizing queues the Stripe mirror, webhooks
    try:  # one transaction for the whole run: all drafts change together or not at all
        with database_url(args.data_dir) as url, transaction(get_engine(url)) as session:
            now = as_of_time(args.as_of, datetime.now(UTC), ("--as-of",))
            summary = run_invoices(
                session,
                args.period,
                now,
                config=BillingSettings.of(get_settings()),
                customer_id=args.customer,
                finalize=args.finalize,
                force=args.force,
                progress=ProgressBar("customers"),
            )
    except ApiError as error:
        print(f"gpumeter invoices run: {error}", file=sys.stderr)
        return 2
    for customer_id, message in summary.failures.items():
        print(f"customer {customer_id} skipped: {message}", file=sys.stderr)
    print(summary.line())
    return 1 if summary.failures else 0


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


def cmd_register_node(args: argparse.Namespace) -> int:
    from app.core.db import get_engine, transaction
    from app.fleet import service
    from app.fleet.schemas import NodeCreate

    data = NodeCreate(hostname=args.hostname, datacenter=args.datacenter)
    with database_url(args.data_dir) as url, transaction(get_engine(url)) as session:
        node, issued = service.enroll_node(session, data)
    if args.token_file is None:
        print(issued.secret)
    else:
        args.token_file.write_text(issued.secret + "\n")
        args.token_file.chmod(0o600)
    print(f"# node {node.id} ({args.hostname}): agent token issued", file=sys.stderr)
    return 0


def _aware_time(text: str) -> datetime:
    """An ISO 8601 time with its zone (``Z`` or an offset), for ``--as-of``."""
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO 8601 time: {text!r}") from None
    if value.tzinfo is None:
        raise argparse.ArgumentTypeError(f"give the zone too, e.g. {text}Z")
    return value


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < value < 3600:
        raise argparse.ArgumentTypeError(f"give seconds between 0 and 3600, not {text}")
    return value


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gpumeter")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpumeter", description="Per-second GPU metering and billing service."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser("serve", help="run the API service under uvicorn")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port to bind (default 8000)")
    serve.add_argument("--workers", type=int, default=1, help="worker processes (default 1)")
    serve.add_argument(
        "--no-worker",
        action="store_true",
        help="run no job-queue worker in the service (when `gpumeter worker` runs separately; "
        "same as GPUMETER_WORKER_IN_PROCESS=false)",
    )
    _add_data_dir(serve)
    serve.set_defaults(handler=cmd_serve)

    db = commands.add_parser("db", help="database schema").add_subparsers(
        dest="db_command", required=True, metavar="DB_COMMAND"
    )
    upgrade = db.add_parser("upgrade", help="apply Alembic migrations")
    upgrade.add_argument("--revision", default="head", help="target revision (default head)")
    _add_data_dir(upgrade)
    upgrade.set_defaults(handler=cmd_db_upgrade)

    admin = commands.add_parser("admin", help="administration").add_subparsers(
        dest="admin_command", required=True, metavar="ADMIN_COMMAND"
    )
    create_key = admin.add_parser("create-key", help="create an API key and print it once")
    create_key.add_argument("--kind", choices=["admin", "customer", "node"], default="admin")
    create_key.add_argument("--name", required=True, help="a label for the key")
    create_key.add_argument(
        "--customer", type=uuid.UUID, default=None, help="customer id (for --kind customer)"
    )
    create_key.add_argument(
        "--node", type=uuid.UUID, default=None, help="node id (for --kind node)"
    )
    _add_data_dir(create_key)
    create_key.set_defaults(handler=cmd_create_key)
    register_node = admin.add_parser(
        "register-node",
        help="register a node (or rotate a registered node's token) and output its agent token",
    )
    register_node.add_argument("--hostname", required=True, help="the node's hostname")
    register_node.add_argument("--datacenter", default="default", help="datacenter label")
    register_node.add_argument(
        "--token-file", type=Path, default=None, help="write the token here (default: stdout)"
    )
    _add_data_dir(register_node)
    register_node.set_defaults(handler=cmd_register_node)

    simulate = commands.add_parser(
        "simulate",
        help="write a synthetic fleet's history (rentals, telemetry, failures), or replay a "
        "published scenario and print its cost table",
    )
    simulate.add_argument("--gpus", type=int, default=None, help="GPUs to create (default 3000)")
    simulate.add_argument(
        "--days", type=float, default=None, help="days of history, ending now (default 30)"
    )
    simulate.add_argument(
        "--failure-rate",
        type=float,
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
    # --- seed: scenario replay ---
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
        type=float,
        default=1.0,
        help="with --scenario: GPUs x this (rates and days kept; default 1)",
    )
    simulate.add_argument(
        "--keep",
        action="store_true",
        help="with --scenario: keep its database and print its URL (default: dropped)",
    )
    # --- end seed ---
    _add_data_dir(simulate)
    simulate.set_defaults(handler=cmd_simulate)

    demo = commands.add_parser(
        "demo",
        help="the whole product on this machine: service, agents with a scripted GPU failure, "
        "a backfilled month, invoices, the dashboard",
    )
    demo.add_argument(
        "--duration",
        type=float,
        default=None,
        help="seconds to run once ready, then print the summary and exit (default: until Ctrl-C)",
    )
    demo.add_argument("--port", type=int, default=8000, help="port to serve on (default 8000)")
    demo.add_argument(
        "--fail-after",
        type=_positive_seconds,
        default=20,
        help="seconds after the agents start that the scripted GPU fails (default 20)",
    )
    demo.add_argument(
        "--restart-after",
        type=_positive_seconds,
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
    demo.set_defaults(handler=cmd_demo)

    stripe = commands.add_parser("stripe", help="the Stripe mirror").add_subparsers(
        dest="stripe_command", required=True, metavar="STRIPE_COMMAND"
    )
    stripe_sync = stripe.add_parser(
        "sync",
        help="mirror the finalized and voided invoices that are due into Stripe now, then exit "
        "(workers do it continuously)",
    )
    _add_data_dir(stripe_sync)
    stripe_sync.set_defaults(handler=cmd_stripe_sync)
    worker = commands.add_parser(
        "worker",
        help="run a job-queue worker (Stripe mirror, webhooks, scheduled invoice runs) until "
        "SIGTERM; run as many as you like",
    )
    worker.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="jobs at once (default GPUMETER_WORKER_CONCURRENCY)",
    )
    worker.add_argument(
        "--metrics-port", type=int, default=None, help="serve Prometheus metrics on this port"
    )
    worker.add_argument(
        "--metrics-host", default="127.0.0.1", help="address for --metrics-port (default 127.0.0.1)"
    )
    _add_data_dir(worker)
    worker.set_defaults(handler=cmd_worker)

    invoices = commands.add_parser("invoices", help="invoices").add_subparsers(
        dest="invoices_command", required=True, metavar="INVOICES_COMMAND"
    )
    invoices_run = invoices.add_parser(
        "run",
        help="draft (and with --finalize, finalize) every customer's invoice for a period; "
        "idempotent, finalized invoices are never touched",
    )
    invoices_run.add_argument("--period", required=True, help="billing month, YYYY-MM")
    invoices_run.add_argument("--customer", type=uuid.UUID, default=None, help="one customer id")
    invoices_run.add_argument("--finalize", action="store_true", help="number and lock them")
    invoices_run.add_argument(
        "--force", action="store_true", help="finalize before the period's grace time passed"
    )
    invoices_run.add_argument(
        "--as-of",
        type=_aware_time,
        default=None,
        help="run as of this past time (ISO 8601 with a zone, e.g. 2026-11-01T06:00:00Z): "
        "grace, vouchers, generated_at and finalized_at are judged then (default: now)",
    )
    _add_data_dir(invoices_run)
    invoices_run.set_defaults(handler=cmd_invoices_run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    import app.models  # noqa: F401 - every table registered before any command's session
    from app.core.embedded_pg import PostgresDidNotStop

    args = build_parser().parse_args(argv)
    configure_logging(get_settings().log_level)
    try:
        return int(args.handler(args))
    except PostgresDidNotStop as error:
        print(f"gpumeter: {error}; see the log in its data directory", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
