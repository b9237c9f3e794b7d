"""Running the service: `serve`, `worker`, `db upgrade`, `stripe sync`."""

from __future__ import annotations

import argparse
import os
import resource
import signal
import sys
from pathlib import Path
from typing import Any

from app.cli.common import PORT, Group, bounded_int, command, database_url, group
from app.settings import Settings, embedded_secret_key, get_settings

# Every node's agent keeps one connection open between uploads (a reconnect per upload costs
# the service more than the batch: bench/HISTORY.md, 2026-12-07): a worker holds thousands.
CONNECTIONS_PER_WORKER = 8192


def exit_cleanly_on_sigterm() -> None:
    """Turn SIGTERM into a normal exit, so `finally` blocks (stopping the embedded Postgres) run.

    uvicorn re-raises the signal that stopped it once it has shut down; with Python's default
    SIGTERM action the process would die right there, leaving Postgres running.
    """
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))


def open_files_for(connections: int) -> None:
    """Raise the soft open-file limit (often 1,024) towards the hard one, so the connection
    cap is what refuses connections, not EMFILE; say so when the hard limit is lower."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = connections + 1024  # the database pool, logs and the worker's own files
    if soft < wanted:
        raised = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
        if raised < wanted:
            print(
                f"gpumeter serve: the open-file limit is {raised} (hard), below the {wanted} "
                "that the connection cap needs; raise it (ulimit -n, LimitNOFILE=)",
                file=sys.stderr,
            )


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

    if not ensure_secret_key(args.data_dir):
        return 2
    exit_cleanly_on_sigterm()
    open_files_for(CONNECTIONS_PER_WORKER)
    with database_url(args.data_dir) as url:
        migrate.upgrade(url)
        # Workers are separate processes: they read the URL from the environment.
        os.environ["GPUMETER_DATABASE_URL"] = url
        if args.no_worker:
            os.environ["GPUMETER_WORKER_IN_PROCESS"] = "false"
        get_settings.cache_clear()
        uvicorn.run(
            "app.main:app_from_environment",
            factory=True,
            host=args.host,
            port=args.port,
            workers=args.workers,
            **uvicorn_options(get_settings()),
        )
    return 0


def uvicorn_options(settings: Settings) -> dict[str, Any]:
    """How `serve` runs uvicorn, apart from the app and the address (bench/ingest.py's HTTP
    floor runs a no-op app with the same options)."""
    from app.core.limits import BoundedHttpToolsProtocol

    return {
        "log_config": None,
        "access_log": False,
        # Slow, oversized and idle connections are closed (headers: BoundedHttpToolsProtocol;
        # bodies: app.core.limits); shedding is the app's (JSON 503), this is only a hard cap.
        "http": BoundedHttpToolsProtocol,
        "timeout_keep_alive": settings.keep_alive_s,
        "limit_concurrency": CONNECTIONS_PER_WORKER,
        "timeout_graceful_shutdown": settings.shutdown_timeout_s,
        # A trusted proxy's X-Forwarded-For is the client's address (the auth throttle's key).
        "proxy_headers": True,
        "forwarded_allow_ips": settings.forwarded_allow_ips,
    }


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


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    from app.core import migrate

    with database_url(args.data_dir) as url:
        migrate.upgrade(url, args.revision)
    print(f"database migrated to {args.revision}")
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


def add_serve(commands: Group) -> None:
    serve = command(commands, "serve", cmd_serve, "run the API service under uvicorn")
    serve.set_defaults(service=True)
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument(
        "--port", type=bounded_int(*PORT), default=8000, help="port to bind (default 8000)"
    )
    serve.add_argument(
        "--workers", type=bounded_int(1, 256), default=1, help="worker processes (default 1)"
    )
    serve.add_argument(
        "--no-worker",
        action="store_true",
        help="run no job-queue worker in the service (when `gpumeter worker` runs separately; "
        "same as GPUMETER_WORKER_IN_PROCESS=false)",
    )


def add_worker(commands: Group) -> None:
    worker = command(
        commands,
        "worker",
        cmd_worker,
        "run a job-queue worker (Stripe mirror, webhooks, scheduled invoice runs) until "
        "SIGTERM; run as many as you like",
    )
    worker.set_defaults(service=True)
    worker.add_argument(
        "--concurrency",
        type=bounded_int(1, 64),
        default=None,
        help="jobs at once (default GPUMETER_WORKER_CONCURRENCY)",
    )
    worker.add_argument(
        "--metrics-port",
        type=bounded_int(*PORT),
        default=None,
        help="serve Prometheus metrics on this port",
    )
    worker.add_argument(
        "--metrics-host", default="127.0.0.1", help="address for --metrics-port (default 127.0.0.1)"
    )


def add_db(commands: Group) -> None:
    db = group(commands, "db", "database schema")
    upgrade = command(db, "upgrade", cmd_db_upgrade, "apply Alembic migrations")
    upgrade.add_argument("--revision", default="head", help="target revision (default head)")


def add_stripe(commands: Group) -> None:
    stripe = group(commands, "stripe", "the Stripe mirror")
    command(
        stripe,
        "sync",
        cmd_stripe_sync,
        "mirror the finalized and voided invoices that are due into Stripe now, then exit "
        "(workers do it continuously)",
    )
