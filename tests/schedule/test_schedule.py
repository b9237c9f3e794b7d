"""The scheduled monthly invoice run: each zone's month once its grace time is over, once.
And the hourly store of the closed days' usage rollups."""

from __future__ import annotations

from datetime import UTC, datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from sqlalchemy import Engine, select

from app.billing.endpoints import clock
from app.billing.models import UsageRollupSpan
from app.billing.usage import UsageSettings
from app.core.db import transaction
from app.schedule.service import closed_period, store_rollups, tick
from app.settings import get_settings
from tests.billing.world import october_with_failure
from tests.core.workers import workers
from tests.harness import Console, wait_for


@pytest.mark.parametrize(
    ("zone", "now", "period"),
    [
        ("UTC", "2026-12-01T05:59:59+00:00", None),  # November's grace (6 h) not over
        ("UTC", "2026-12-01T06:00:00+00:00", "2026-11"),
        ("America/New_York", "2026-12-01T10:59:59+00:00", None),  # its month ends 05:00 UTC
        ("America/New_York", "2026-12-01T11:00:00+00:00", "2026-11"),
        ("Pacific/Kiritimati", "2026-11-30T16:00:00+00:00", "2026-11"),  # UTC+14
        ("UTC", "2027-01-15T00:00:00+00:00", "2026-12"),
    ],
)
def test_a_zones_month_is_due_after_its_grace_time(zone: str, now: str, period: str | None) -> None:
    assert closed_period(zone, datetime.fromisoformat(now), 6) == period


def runs(console: Console) -> list[dict[str, Any]]:
    response = console.client.get("/v1/scheduled-invoice-runs", headers=console.headers)
    assert response.status_code == 200, response.text
    return response.json()["items"]


def invoices(console: Console) -> list[dict[str, Any]]:
    return console.client.get("/v1/invoices", headers=console.headers).json()["items"]


def test_a_tick_drafts_and_finalizes_the_closed_month_once(console: Console, db: Engine) -> None:
    october_with_failure(console, db)
    settings, now = get_settings(), datetime(2026, 11, 5, 12, 0, tzinfo=UTC)
    assert len(tick(db, settings, now)) == 1
    assert tick(db, settings, now) == []  # nothing due any more
    [run] = runs(console)
    assert (run["period"], run["timezone"], run["status"]) == ("2026-10", "UTC", "succeeded")
    assert (run["attempts"], run["customers"], run["counts"]) == (1, 1, {"finalized": 1})
    [invoice] = invoices(console)
    assert (invoice["period"], invoice["status"], invoice["number"]) == (
        "2026-10",
        "finalized",
        "GM-2026-000001",
    )


def stored_spans(db: Engine) -> list[tuple[datetime, datetime, datetime]]:
    with transaction(db) as session:
        rows = session.execute(
            select(UsageRollupSpan.start, UsageRollupSpan.end, UsageRollupSpan.rated_at)
        ).all()
    return sorted(
        (datetime.fromtimestamp(lo, UTC), datetime.fromtimestamp(hi, UTC), rated_at)
        for lo, hi, rated_at in rows
    )


def test_the_rollup_job_stores_every_closed_day_and_hour_so_a_read_rates_only_the_last(
    app: FastAPI, console: Console, db: Engine
) -> None:
    world = october_with_failure(console, db)
    now = datetime(2026, 10, 20, 12, 0, tzinfo=UTC)
    assert stored_spans(db) == []
    assert store_rollups(db, now, UsageSettings.of(get_settings())) == 1
    stored = stored_spans(db)
    days = [datetime(2026, 10, d, tzinfo=UTC) for d in range(1, 21)]
    # The hour 11:00-12:00 ended less than the grace (5 min) ago: not stored yet.
    open_span = (days[-1], datetime(2026, 10, 20, 11, tzinfo=UTC))
    assert [(lo, hi) for lo, hi, _ in stored] == [*pairwise(days), open_span]
    # A read, and the job's next run, find every closed span stored and current: no re-rating.
    app.dependency_overrides[clock] = lambda: now
    path = f"/v1/customers/{world.customer['id']}/usage?period=2026-10"
    assert console.client.get(path, headers=console.headers).status_code == 200
    assert store_rollups(db, now, UsageSettings.of(get_settings())) == 1
    assert stored_spans(db) == stored
    # The next day, the 20th replaces its open span; the 21st's starts, to 02:00.
    tomorrow = datetime(2026, 10, 21, 2, 10, tzinfo=UTC)
    assert store_rollups(db, tomorrow, UsageSettings.of(get_settings())) == 1
    spans = [(lo, hi) for lo, hi, _ in stored_spans(db)]
    midnight = datetime(2026, 10, 21, tzinfo=UTC)
    assert spans == [
        *pairwise([*days, midnight]),
        (midnight, datetime(2026, 10, 21, 2, tzinfo=UTC)),
    ]
    assert [r for r in stored_spans(db) if r[0] < days[-1]] == stored[:19]  # older days kept


@pytest.mark.e2e
def test_two_workers_run_a_past_month_exactly_once(
    console: Console, db: Engine, database_url: str, tmp_path: Path
) -> None:
    october_with_failure(console, db)  # its rental runs on through every later month
    every_second = {
        "GPUMETER_INVOICE_SCHEDULE_CRON": "* * * * * */1",
        "GPUMETER_INVOICE_GRACE_HOURS": "0",
    }
    with workers(database_url, tmp_path, count=2, settings=every_second):
        wait_for(lambda: [r["status"] for r in runs(console)] == ["succeeded"], "the run", 90)
        logs = [tmp_path / f"worker-{n}.log" for n in range(2)]
        wait_for(  # several more ticks, on either worker, after the run
            lambda: sum(p.read_text().count("invoice_schedule:tick") for p in logs) >= 12,
            "more ticks",
            60,
        )
    [run] = runs(console)
    assert (run["attempts"], run["counts"]) == (1, {"finalized": 1})
    finalized = [i for i in invoices(console) if i["status"] == "finalized"]
    assert [(i["period"], i["number"]) for i in finalized] == [
        (run["period"], f"GM-{datetime.now(UTC).year}-000001")
    ]
