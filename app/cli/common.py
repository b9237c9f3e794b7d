"""What every command shares: the database, argument checks, and readable or JSON output.

Arguments are checked by their parser's ``type=`` functions, so a wrong one is refused before
anything starts (no embedded Postgres, no log line).
"""

from __future__ import annotations

import argparse
import math
import re
import sys
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeAlias, TypeVar

from pydantic import BaseModel, ValidationError
from sqlalchemy.orm import Session

from app.auth.models import KeyKind
from app.auth.principal import Principal
from app.billing.loader import PERIOD_PATTERN
from app.core.epoch import check_in_range
from app.core.pagination import MAX_OFFSET, Page, PageParams
from app.settings import get_settings

Handler = Callable[[argparse.Namespace], int]
Group: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"  # subcommands
E = TypeVar("E", bound=StrEnum)

# Whoever runs an administration command has the database itself: an admin without a key.
OPERATOR = Principal(key_id=uuid.UUID(int=0), kind=KeyKind.ADMIN)


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


@contextmanager
def transaction(args: argparse.Namespace) -> Iterator[Session]:
    """The command's one transaction: it commits when the command's work succeeded."""
    from app.core.db import get_engine
    from app.core.db import transaction as begin

    with database_url(args.data_dir) as url, begin(get_engine(url)) as session:
        yield session


def group(commands: Group, name: str, help: str) -> Group:
    """A command group (`gpumeter invoices ...`): its subcommands, one of them required."""
    parser = commands.add_parser(name, help=help, description=help)
    return parser.add_subparsers(dest=f"{name}_command", required=True, metavar="COMMAND")


def command(
    group: Group,
    name: str,
    handler: Handler,
    help: str,
    *,
    database: bool = True,
) -> argparse.ArgumentParser:
    """A leaf command: ``help`` in its group's list and as its own description; with
    ``database``, it takes --data-dir for the embedded Postgres."""
    parser: argparse.ArgumentParser = group.add_parser(name, help=help, description=help)
    parser.set_defaults(handler=handler, prog=parser.prog, service=False)
    if database:
        add_data_dir(parser)
    return parser


def add_data_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="embedded Postgres data directory, used when GPUMETER_DATABASE_URL is unset "
        f"(default: {get_settings().data_dir})",
    )


def add_output(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json",
        action="store_true",
        help="print the API's JSON for it instead of a table (for scripts)",
    )


def add_yes(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--yes", action="store_true", help=f"{what} without asking (for scripts)")


def confirmed(args: argparse.Namespace, question: str) -> bool:
    """``--yes``, or the operator's "y" to ``question`` at a terminal; without a terminal (a
    script) nothing is asked and the answer is no, with a word on how to say yes."""
    if args.yes:
        return True
    if not sys.stdin.isatty():
        print(
            f"{question} Not confirmed: pass --yes to confirm without a terminal.", file=sys.stderr
        )
        return False
    print(f"{question} [y/N] ", end="", file=sys.stderr, flush=True)
    return sys.stdin.readline().strip().lower() in ("y", "yes")


def add_paging(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--limit",
        type=bounded_int(1, 1000),
        default=100,
        help="rows to show, 1 to 1000 (default 100)",
    )
    parser.add_argument(
        "--offset", type=bounded_int(0, MAX_OFFSET), default=0, help="rows to skip (default 0)"
    )


def paging(args: argparse.Namespace) -> PageParams:
    return PageParams(limit=args.limit, offset=args.offset)


# --- argument checks (argparse ``type=``) ------------------------------------------------------

# Months start first at UTC+14: a month that has not started there has started nowhere.
_EARLIEST_ZONE = timezone(timedelta(hours=14))


def month(text: str) -> str:
    """A billing month, YYYY-MM."""
    if not re.match(PERIOD_PATTERN, text):
        raise argparse.ArgumentTypeError(
            f"give a billing month as YYYY-MM, 1970-01 to 2999-12, not {text!r}"
        )
    return text


def started_month(text: str) -> str:
    """A billing month that has begun somewhere on Earth by now (each customer's time zone is
    checked again by the run)."""
    year, number = map(int, month(text).split("-"))
    if datetime(year, number, 1, tzinfo=_EARLIEST_ZONE) > datetime.now(UTC):
        raise argparse.ArgumentTypeError(f"period {text} has not started yet")
    return text


def past_time(text: str) -> datetime:
    """An ISO 8601 time with its zone (``Z`` or an offset), not in the future."""
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO 8601 time: {text!r}") from None
    if value.tzinfo is None:
        raise argparse.ArgumentTypeError(f"give the zone too, e.g. {text}Z")
    try:
        check_in_range(value)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    if value > datetime.now(UTC):
        raise argparse.ArgumentTypeError(f"{text} is in the future")
    return value


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < value < 3600:
        raise argparse.ArgumentTypeError(f"give seconds between 0 and 3600, not {text}")
    return value


PORT = (1, 65535)


def number_above(low: float, *, or_equal: bool = False) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not (low <= value if or_equal else low < value) or value == math.inf:
            above = f"{low} or more" if or_equal else f"above {low}"
            raise argparse.ArgumentTypeError(f"give a number {above}, not {text}")
        return value

    return parse


def bounded_int(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"give {low} to {high}, not {text}")
        return value

    return parse


def field_of(schema: type[BaseModel], name: str) -> Callable[[str], str]:
    """Text checked by the API's own rule for ``schema``'s field ``name``."""

    def parse(text: str) -> str:
        try:
            checked = schema.__pydantic_validator__.validate_assignment(
                schema.model_construct(), name, text
            )
        except ValidationError as error:
            raise argparse.ArgumentTypeError(error.errors()[0]["msg"]) from None
        return str(getattr(checked, name))

    return parse


def member_of(kinds: type[E]) -> Callable[[str], E]:
    """One of an enumeration's values (use with ``choices=list(kinds)`` for the help)."""

    def parse(text: str) -> E:
        try:
            return kinds(text)
        except ValueError:
            names = ", ".join(kind.value for kind in kinds)
            raise argparse.ArgumentTypeError(f"give one of {names}, not {text!r}") from None

    return parse


def identifier(what: str) -> Callable[[str], uuid.UUID]:
    """A UUID argument, refused with what it names ("not an invoice id (a UUID): 'x'")."""

    def parse(text: str) -> uuid.UUID:
        try:
            return uuid.UUID(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not {what} id (a UUID): {text!r}") from None

    return parse


# --- output ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Column:
    """A table column: its header and how a row shows in it; numbers are right-aligned."""

    header: str
    value: Callable[[Any], object]
    right: bool = False


def show(value: object) -> str:
    """A value as a table shows it: times in UTC to the second, nothing as "-"."""
    if value is None or value == "":
        return "-"
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")
    return str(value)


def print_table(rows: Sequence[Any], columns: Sequence[Column], empty: str) -> None:
    if not rows:
        print(empty)
        return
    cells = [[show(column.value(row)) for column in columns] for row in rows]
    widths = [max(len(c.header), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]

    def line(values: Iterable[str]) -> str:
        parts = (
            value.rjust(width) if column.right else value.ljust(width)
            for value, width, column in zip(values, widths, columns, strict=True)
        )
        return "  ".join(parts).rstrip()

    print(line(c.header for c in columns))
    for row_cells in cells:
        print(line(row_cells))


def print_page(page: Page[Any], columns: Sequence[Column], empty: str, as_json: bool) -> None:
    """A list command's page: the API's page JSON, or a table and where the next page starts."""
    if as_json:
        print_json(page)
        return
    print_table(page.items, columns, empty)
    if page.next_offset is not None:
        print(f"# more follow: --offset {page.next_offset}", file=sys.stderr)


def print_fields(fields: Sequence[tuple[str, object]]) -> None:
    """One item as "label  value" lines."""
    width = max(len(label) for label, _ in fields)
    for label, value in fields:
        print(f"{label.ljust(width)}  {show(value)}")


def print_json(model: BaseModel) -> None:
    print(model.model_dump_json(indent=2))
