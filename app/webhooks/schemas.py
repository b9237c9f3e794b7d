from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated

from pydantic import AnyUrl, Field, UrlConstraints

from app.core.schemas import Schema
from app.webhooks.models import DeliveryStatus

EventType = Annotated[str, Field(pattern=r"^[a-z][a-z_]*(\.[a-z][a-z_]*)+$", max_length=100)]
WebhookUrl = Annotated[AnyUrl, UrlConstraints(max_length=2000, allowed_schemes=["http", "https"])]


class EndpointCreate(Schema):
    url: WebhookUrl
    event_types: list[EventType] = Field(
        default=[], max_length=100, description="Event types to deliver; empty: every type."
    )
    customer_id: uuid.UUID | None = Field(
        default=None, description="Only this customer's events; unset: every event."
    )
    enabled: bool = True
    description: str | None = Field(default=None, max_length=500)


class EndpointUpdate(Schema):
    url: WebhookUrl | None = None
    event_types: list[EventType] | None = Field(default=None, max_length=100)
    enabled: bool | None = Field(default=None, description="true also clears the failure streak.")
    description: str | None = Field(default=None, max_length=500)


class EndpointRead(Schema):
    id: uuid.UUID
    url: str
    event_types: list[str]
    customer_id: uuid.UUID | None
    enabled: bool
    description: str | None
    failure_streak: int
    failing_since: datetime | None
    disabled_reason: str | None
    created_at: datetime
    updated_at: datetime


class EndpointWithSecret(EndpointRead):
    secret: str  # shown only now: on creation and rotation


class AttemptRead(Schema):
    number: int
    at: datetime
    status_code: int | None
    error: str | None
    duration_ms: int


class DeliveryRead(Schema):
    id: int
    endpoint_id: uuid.UUID
    event_id: uuid.UUID
    event_type: str
    status: DeliveryStatus
    attempts: int
    next_attempt_at: datetime | None
    last_status_code: int | None
    last_error: str | None
    delivered_at: datetime | None
    created_at: datetime
    log: list[AttemptRead]
