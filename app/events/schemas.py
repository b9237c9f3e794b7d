from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from pydantic import AliasChoices, Field

from app.core.schemas import Schema


class EventRead(Schema):
    """An event as every consumer sees it: the API, webhook bodies and NATS messages."""

    id: uuid.UUID
    type: str
    timestamp: datetime = Field(validation_alias=AliasChoices("occurred_at", "timestamp"))
    subject: str
    customer_id: uuid.UUID | None
    version: int
    data: dict[str, Any]


class EventPage(Schema):
    items: list[EventRead]
    limit: int
    next_cursor: str  # pass as ``after`` to continue after this page (also when it is empty)
    has_more: bool  # more events follow now; false: poll again later with next_cursor
