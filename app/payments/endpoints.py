"""Stripe: the webhook receiver, and reads of each invoice's mirror and failed payments."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Request

from app.auth.deps import Admin, ConsoleUser
from app.core.deps import AppSettings, DbSession
from app.core.pagination import Page, Paging, paginate
from app.payments import repository, service
from app.payments.models import SyncState
from app.payments.schemas import InvoiceStripeRead, OutboxRead, SyncRead, WebhookAck

router = APIRouter(prefix="/v1/stripe", tags=["stripe"])


async def _raw_body(request: Request) -> bytes:
    return await request.body()


@router.post(
    "/webhook",
    responses={400: {"description": "bad or stale Stripe signature, or not a Stripe event"}},
)
def stripe_webhook(
    session: DbSession,
    settings: AppSettings,
    body: Annotated[bytes, Depends(_raw_body)],
    stripe_signature: Annotated[str | None, Header()] = None,
) -> WebhookAck:
    """Stripe's event deliveries, authenticated by their signature; each event applies once."""
    stripe_keys = service.StripeSettings.of(settings)
    event_id, duplicate = service.receive_webhook(session, body, stripe_signature, stripe_keys)
    return WebhookAck(event_id=event_id, duplicate=duplicate)


@router.get("/sync")
def list_syncs(
    session: DbSession,
    _: Admin,
    page: Paging,
    state: SyncState | None = None,
    customer_id: uuid.UUID | None = None,
) -> Page[OutboxRead]:
    """The sync outbox, oldest first; ``state=failed`` lists what needs an operator."""
    query = repository.outbox_query(state=state, customer_id=customer_id)
    return paginate(session, query, page, OutboxRead)


@router.get("/invoices/{invoice_id}")
def read_invoice_mirror(
    invoice_id: uuid.UUID, session: DbSession, caller: ConsoleUser
) -> InvoiceStripeRead:
    return service.invoice_view(session, invoice_id, caller)


@router.post("/invoices/{invoice_id}/retry")
def retry_invoice_sync(invoice_id: uuid.UUID, session: DbSession, _: Admin) -> SyncRead:
    """Queue a failed sync again (after fixing its cause); a worker runs it right away."""
    return SyncRead.model_validate(service.retry_sync(session, invoice_id))
