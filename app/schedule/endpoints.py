"""``GET /v1/scheduled-invoice-runs``: what the monthly run did, per month and time zone."""

from __future__ import annotations

from fastapi import APIRouter

from app.auth.deps import Admin
from app.core.deps import DbSession
from app.core.pagination import Page, Paging, paginate
from app.schedule import repository
from app.schedule.schemas import ScheduledRunRead

router = APIRouter(prefix="/v1/scheduled-invoice-runs", tags=["billing"])


@router.get("")
def list_runs(session: DbSession, _: Admin, page: Paging) -> Page[ScheduledRunRead]:
    """Newest first: status, attempts and per-outcome customer counts of each zone's month."""
    return paginate(session, repository.runs_query(), page, ScheduledRunRead)
