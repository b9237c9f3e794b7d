"""Time crosses one boundary: integer UTC epoch seconds in the metering and rating paths,
timezone-aware datetimes in the API and the database."""

from __future__ import annotations

from datetime import UTC, datetime

# The times the service takes, in UTC after the zone offset: [1970-01-01, 2200-01-01). Outside
# them a time is a typing mistake (year 1, year 10000) that Postgres may store but Python could
# not read back (before year 1 or after 9999 once the offset is applied), which would break
# every read and invoice run touching the row.
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(2200, 1, 1, tzinfo=UTC)


def epoch(moment: datetime) -> int:
    return int(moment.timestamp())


def from_epoch(second: int) -> datetime:
    return datetime.fromtimestamp(second, UTC)


def check_in_range(moment: datetime) -> datetime:
    """``moment`` if the service takes it (``EARLIEST`` <= it < ``LATEST``), else ValueError.
    Aware datetimes compare as instants without converting, so year 9999 at -05:00 is no
    overflow here."""
    if not EARLIEST <= moment < LATEST:
        raise ValueError(
            f"{moment.isoformat()} is out of range: give a time from 1970-01-01 to "
            "2199-12-31 UTC (after its offset)"
        )
    return moment
