"""`gpumeter`: run the service and administer it. Every command has --help."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from app.core.logging import configure_logging
from app.settings import get_settings

Handler = Callable[[argparse.Namespace], int]


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


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from app.core import migrate

    with database_url(args.data_dir) as url:
        migrate.upgrade(url)
        # Workers are separate processes: they read the URL from the environment.
        os.environ["GPUMETER_DATABASE_URL"] = url
        get_settings.cache_clear()
        uvicorn.run(
            "app.main:app_from_environment",
            factory=True,
            host=args.host,
            port=args.port,
            workers=args.workers,
            log_config=None,
            access_log=False,
        )
    return 0


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    from app.core import migrate

    with database_url(args.data_dir) as url:
        migrate.upgrade(url, args.revision)
    print(f"database migrated to {args.revision}")
    return 0


def cmd_create_key(args: argparse.Namespace) -> int:
    import app.models  # noqa: F401 - registers every table, so foreign keys resolve
    from app.auth.models import KeyKind
    from app.auth.service import issue_key
    from app.core.db import get_engine, transaction

    kind = KeyKind(args.kind)
    with database_url(args.data_dir) as url, transaction(get_engine(url)) as session:
        issued = issue_key(session, kind, args.name, customer_id=args.customer, node_id=args.node)
    print(issued.secret)
    print(
        f"# {kind.value} key {issued.key.id} ({args.name}); it is shown only this once",
        file=sys.stderr,
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpumeter", description="Per-second GPU metering and billing service."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser("serve", help="run the API service under uvicorn")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port to bind (default 8000)")
    serve.add_argument("--workers", type=int, default=1, help="worker processes (default 1)")
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
    create_key.add_argument("--customer", default=None, help="customer id (for --kind customer)")
    create_key.add_argument("--node", default=None, help="node id (for --kind node)")
    _add_data_dir(create_key)
    create_key.set_defaults(handler=cmd_create_key)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(get_settings().log_level)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
