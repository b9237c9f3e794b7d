"""``GET /v1/events``: the event outbox for consumers that poll, oldest first, by cursor."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from app.auth.deps import ConsoleUser
from app.core.deps import DbSession
from app.core.schemas import Instant
from app.events import service
from app.events.schemas import EventPage

router = APIRouter(prefix="/v1/events", tags=["events"])


@router.get("")
def list_events(
    session: DbSession,
    caller: ConsoleUser,
    after: Annotated[
        str | None,
        Query(
            max_length=20, pattern="^[0-9]*$", description="The next_cursor of the previous page."
        ),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    type: Annotated[
        list[str], Query(max_length=100, description="Only these event types (repeatable).")
    ] = [],  # noqa: B006 - FastAPI copies query defaults
    since: Annotated[Instant | None, Query(description="Inclusive.")] = None,
    until: Annotated[Instant | None, Query(description="Exclusive.")] = None,
) -> EventPage:
    """Admins see every event; a customer key sees only its customer's."""
    return service.list_events(
        session, caller, after=after, limit=limit, types=type, since=since, until=until
    )
