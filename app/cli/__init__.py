"""`gpumeter`: run the service and administer it. Every command has --help.

One module per kind of command (`server`, `admin`, `invoices`, `simulation`); each adds its
command groups to the parser. Arguments are checked while parsing, before anything starts.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from app.cli import admin, invoices, server, simulation
from app.core.logging import configure_logging
from app.settings import get_settings


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
    parser.add_argument(
        "--log-file",
        type=Path,
        default=None,
        help="append the JSON logs here, at GPUMETER_LOG_LEVEL (default: stderr; when stderr is "
        "a terminal, a command other than serve and worker logs only warnings and errors there)",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add_group in (
        server.add_serve,
        server.add_worker,
        server.add_db,
        admin.add_admin,
        admin.add_keys,
        admin.add_customers,
        admin.add_gpus,
        invoices.add_invoices,
        simulation.add_simulate,
        simulation.add_demo,
        server.add_stripe,
    ):
        add_group(commands)
    return parser


@contextmanager
def logging_for(args: argparse.Namespace) -> Iterator[None]:
    """JSON logs to --log-file, else to stderr; a one-off command on a terminal keeps info
    logs (embedded Postgres, the job queue's set-up) off it, so its output stays readable."""
    level = get_settings().log_level
    if args.log_file is not None:
        with args.log_file.open("a") as log_file:
            configure_logging(level, stream=log_file)
            try:
                yield
            finally:
                configure_logging(level)
        return
    quiet = not args.service and sys.stderr.isatty()
    if quiet and logging.getLevelNamesMapping().get(level.upper(), 0) < logging.WARNING:
        level = "warning"
    configure_logging(level)
    yield


def main(argv: Sequence[str] | None = None) -> int:
    from sqlalchemy.exc import OperationalError

    import app.models  # noqa: F401 - every table registered before any command's session
    from app.core.embedded_pg import PostgresDidNotStop
    from app.core.errors import ApiError

    args = build_parser().parse_args(argv)
    with logging_for(args):
        try:
            return int(args.handler(args))
        except ApiError as error:  # what the API answers with a 4xx: unknown id, wrong state
            print(f"{args.prog}: {error}", file=sys.stderr)
            return 2
        except OperationalError as error:  # unreachable, refused, cancelled: no traceback
            print(f"{args.prog}: database error: {error.orig}", file=sys.stderr)
            return 1
        except PostgresDidNotStop as error:
            print(f"{args.prog}: {error}; see the log in its data directory", file=sys.stderr)
            return 1
