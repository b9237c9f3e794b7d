"""The FastAPI application factory."""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, nullcontext
from dataclasses import replace
from typing import Any

from fastapi import FastAPI
from fastapi_offline import FastAPIOffline
from sqlalchemy import Engine
from starlette.concurrency import run_in_threadpool
from starlette.middleware.errors import ServerErrorMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

import app.models  # noqa: F401 - the composition root registers every table (foreign keys)
from app.auth.deps import key_principal
from app.auth.endpoints import router as keys_router
from app.auth.middleware import AuthenticateFirst
from app.auth.principal import Principal
from app.auth.throttle import FailedAuthThrottle, ThrottleFailedAuth
from app.balances.endpoints import router as balances_router
from app.billing.endpoints import customer_router as billing_customer_router
from app.billing.endpoints import router as invoices_router
from app.budgets.endpoints import router as budgets_router
from app.core.browser import SecurityHeaders
from app.core.db import get_engine
from app.core.errors import document_errors, install_error_handlers, internal_error
from app.core.health import router as health_router
from app.core.idempotency import IdempotentPosts
from app.core.idempotency import document as document_idempotency
from app.core.limits import Limits, RequestLimits
from app.core.metrics import router as metrics_router
from app.core.queue import worker_in_background
from app.customers.endpoints import router as customers_router
from app.dashboard import endpoints as dashboard
from app.events.endpoints import router as events_router
from app.failover.endpoints import router as failovers_router
from app.failover.endpoints import spares as spares_router
from app.fleet.endpoints import router as fleet_router
from app.fleet.service import IngestGpus
from app.metering import endpoints as ingest
from app.metering.group_commit import GroupCommit
from app.payments.endpoints import router as stripe_router
from app.plans.endpoints import router as plans_router
from app.rentals.endpoints import router as rentals_router
from app.schedule.endpoints import router as schedule_router
from app.settings import get_settings
from app.slurm.endpoints import router as slurm_router
from app.webhooks.endpoints import router as webhooks_router
from app.wiring import install as install_subscribers
from metering_agent.protocol import INGEST_PATH

INGEST_DRAIN_S = 10.0  # at shutdown, the longest the ingest writers may take to empty

ROUTERS = [
    health_router,
    metrics_router,
    keys_router,
    customers_router,
    dashboard.router,
    dashboard.pages,
    events_router,
    failovers_router,
    spares_router,
    fleet_router,
    invoices_router,
    balances_router,
    billing_customer_router,
    budgets_router,
    plans_router,
    rentals_router,
    schedule_router,
    slurm_router,
    stripe_router,
    webhooks_router,
]


class IngestFirst:
    """Ingest's path, the busiest by far, served ahead of FastAPI's stack (by
    ``app.metering.endpoints.IngestEndpoint``, under the same request limits with in-flight
    slots of its own); every other request goes through the stack."""

    def __init__(self, stack: ASGIApp, ingest: ASGIApp) -> None:
        self.stack = stack
        self.ingest = ingest

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == INGEST_PATH:
            await self.ingest(scope, receive, send)
        else:
            await self.stack(scope, receive, send)


def create_app(engine: Engine | None = None, *, worker: bool | None = None) -> FastAPI:
    """The service; with ``worker`` (default: ``GPUMETER_WORKER_IN_PROCESS``) a job-queue
    worker runs on its event loop while it serves."""
    in_process = get_settings().worker_in_process if worker is None else worker

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        background: AbstractAsyncContextManager[object] = (
            worker_in_background(app.state.engine, get_settings()) if in_process else nullcontext()
        )
        try:
            async with background:
                yield
        finally:  # requests have finished: store what their writers still hold
            await run_in_threadpool(app.state.ingest_writers.close, INGEST_DRAIN_S)

    # Swagger UI and ReDoc from packaged assets: /docs works offline (no CDN).
    app = FastAPIOffline(
        title="gpumeter",
        version="0.1.0",
        description="Per-second GPU metering and billing: console API, ingest, invoices.",
        lifespan=lifespan,
        favicon_url="/favicon.ico",
    )
    app.state.engine = engine or get_engine()
    # Ingest's writers, over metering's port to the fleet's GPUs.
    settings = get_settings()
    gpus = IngestGpus.of(settings)
    app.state.ingest_writers = GroupCommit.of(app.state.engine, gpus, settings)
    install_subscribers()
    install_error_handlers(app)
    dashboard.install(app)
    # Outermost first on the way in: size and concurrency limits, then the key, then a POST's
    # Idempotency-Key (its transaction lent to the endpoint), then the app.
    app.add_middleware(IdempotentPosts, owner=_tenant, ttl_s=settings.idempotency_key_ttl_s)
    app.add_middleware(AuthenticateFirst)
    app.add_middleware(RequestLimits)
    app.add_middleware(SecurityHeaders)  # on every answer, the limits' 503s and 413s too
    # Ingest has in-flight slots of its own: its requests hold no database connection while
    # they wait for their writer, so the pool-sized slots would only cap its groups.
    settings = get_settings()
    limits = replace(Limits.of(settings), max_in_flight=settings.ingest_in_flight)
    endpoint = RequestLimits(ingest.IngestEndpoint(app.state.ingest_writers, settings), limits)
    build_stack = app.build_middleware_stack  # Starlette builds it at the first request
    # Failed authentication is throttled outermost: ingest's node tokens too.
    app.state.auth_throttle = throttle = FailedAuthThrottle.of(settings)

    async def valid_key(key: str) -> bool:
        return await key_principal(app.state.engine, key) is not None

    # Any error nothing else handled is the API's JSON 500, ingest's and the throttle's too
    # (Starlette's own handler covers only the stack it builds).
    app.build_middleware_stack = lambda: ServerErrorMiddleware(  # type: ignore[method-assign]
        ThrottleFailedAuth(IngestFirst(build_stack(), endpoint), throttle, valid_key),
        handler=internal_error,
    )
    for router in ROUTERS:
        app.include_router(router)
    document_errors(app, served_elsewhere=_document_apart)
    return app


def _tenant(scope: Scope) -> str | None:
    """The tenant of a request's API key (``AuthenticateFirst`` found it), for its
    Idempotency-Key; None without one."""
    principal: Principal | None = scope.get("state", {}).get("principal")
    return None if principal is None else principal.tenant


def _document_apart(schema: dict[str, Any]) -> None:
    """What FastAPI's OpenAPI does not say: ingest's operation, the Idempotency-Key header."""
    ingest.document(schema)
    document_idempotency(schema)


def app_from_environment() -> FastAPI:
    """Entry point for uvicorn workers (`factory=True`): settings come from the environment."""
    from app.core.logging import configure_logging

    configure_logging(get_settings().log_level)
    app = create_app()
    # What start-up made (modules, the app, its routes and schemas) lives as long as the
    # worker: out of the collector's sight, its older-generation passes stop walking it
    # (ingest: 5.0 -> 4.6 ms of service CPU a batch).
    gc.freeze()
    return app
