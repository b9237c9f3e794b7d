from __future__ import annotations

from sqlalchemy import Select, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from app.schedule.models import RunStatus, ScheduledRun


def add_due(session: Session, period: str, timezone: str, finalize: bool) -> None:
    """Note the zone's period as due, unless it is noted already."""
    session.execute(
        insert(ScheduledRun)
        .values(
            period=period,
            timezone=timezone,
            status=RunStatus.PENDING,
            finalize=finalize,
            attempts=0,
            customers=0,
            counts={},
            failures={},
        )
        .on_conflict_do_nothing(index_elements=["period", "timezone"])
    )


def claim_next(session: Session, max_attempts: int, exclude: list[int]) -> ScheduledRun | None:
    """The oldest run still to do that no other worker holds, locked for this transaction."""
    query = (
        select(ScheduledRun)
        .where(
            ScheduledRun.status.in_([RunStatus.PENDING, RunStatus.FAILED]),
            ScheduledRun.attempts < max_attempts,
            ScheduledRun.id.not_in(exclude),
        )
        .order_by(ScheduledRun.id)
        .limit(1)
        .with_for_update(skip_locked=True)
    )
    return session.scalars(query).first()


def runs_query() -> Select[ScheduledRun]:
    return select(ScheduledRun).order_by(ScheduledRun.id.desc())
