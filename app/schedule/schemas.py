from __future__ import annotations

from datetime import datetime
from typing import Any

from app.core.schemas import Schema
from app.schedule.models import RunStatus


class ScheduledRunRead(Schema):
    id: int
    period: str
    timezone: str
    status: RunStatus
    finalize: bool
    attempts: int
    customers: int
    counts: dict[str, int]  # outcome (drafted, finalized, unchanged, empty, failed) -> customers
    failures: dict[str, Any]  # customer id -> why the billing core refused it
    error: str | None
    created_at: datetime
    finished_at: datetime | None
