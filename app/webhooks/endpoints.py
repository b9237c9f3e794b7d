"""Admin API: webhook endpoints, their secrets, their delivery log, re-sends."""

from __future__ import annotations

import uuid

from fastapi import APIRouter

from app.auth.deps import Admin
from app.core.deps import AppSettings, DbSession, RowId
from app.core.pagination import Page, Paging, paginate
from app.webhooks import repository, service
from app.webhooks.models import DeliveryStatus
from app.webhooks.schemas import (
    DeliveryRead,
    EndpointCreate,
    EndpointRead,
    EndpointUpdate,
    EndpointWithSecret,
)

router = APIRouter(prefix="/v1/webhooks", tags=["webhooks"])


@router.post("/endpoints", status_code=201)
def create_endpoint(
    body: EndpointCreate, session: DbSession, _: Admin, settings: AppSettings
) -> EndpointWithSecret:
    """Register an endpoint; the answer holds its signing secret, shown only this once."""
    return service.create_endpoint(session, body, settings.webhook_allow_private)


@router.get("/endpoints")
def list_endpoints(session: DbSession, _: Admin, page: Paging) -> Page[EndpointRead]:
    return paginate(session, repository.endpoints_query(), page, EndpointRead)


@router.get("/endpoints/{endpoint_id}")
def read_endpoint(endpoint_id: uuid.UUID, session: DbSession, _: Admin) -> EndpointRead:
    return EndpointRead.model_validate(service.get_endpoint(session, endpoint_id))


@router.patch("/endpoints/{endpoint_id}")
def update_endpoint(
    endpoint_id: uuid.UUID,
    body: EndpointUpdate,
    session: DbSession,
    _: Admin,
    settings: AppSettings,
) -> EndpointRead:
    """Change the URL, the event types or the description; enable or disable it."""
    endpoint = service.update_endpoint(session, endpoint_id, body, settings.webhook_allow_private)
    return EndpointRead.model_validate(endpoint)


@router.post("/endpoints/{endpoint_id}/secret")
def rotate_secret(endpoint_id: uuid.UUID, session: DbSession, _: Admin) -> EndpointWithSecret:
    """A new signing secret (shown once); the previous one also signs for 24 hours."""
    return service.rotate_secret(session, endpoint_id)


@router.get("/endpoints/{endpoint_id}/deliveries")
def list_deliveries(
    endpoint_id: uuid.UUID,
    session: DbSession,
    _: Admin,
    page: Paging,
    status: DeliveryStatus | None = None,
) -> Page[DeliveryRead]:
    """The endpoint's delivery log, newest first, each with its attempts."""
    service.get_endpoint(session, endpoint_id)
    rows = session.scalars(
        repository.deliveries_query(endpoint_id, status).limit(page.limit + 1).offset(page.offset)
    ).all()
    more = len(rows) > page.limit
    return Page[DeliveryRead](
        items=service.delivery_views(session, list(rows[: page.limit])),
        limit=page.limit,
        offset=page.offset,
        next_offset=page.offset + page.limit if more else None,
    )


@router.post("/deliveries/{delivery_id}/resend")
def resend(delivery_id: RowId, session: DbSession, _: Admin) -> DeliveryRead:
    """Deliver the event to the endpoint again, now, with a fresh retry window."""
    return service.resend(session, delivery_id)
