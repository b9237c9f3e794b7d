"""Time crosses one boundary: integer UTC epoch seconds in the metering and rating paths,
timezone-aware datetimes in the API and the database."""

from __future__ import annotations

from datetime import UTC, datetime


def epoch(moment: datetime) -> int:
    return int(moment.timestamp())


def from_epoch(second: int) -> datetime:
    return datetime.fromtimestamp(second, UTC)
