"""The FastAPI application factory."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi_offline import FastAPIOffline
from sqlalchemy import Engine

import app.models  # noqa: F401 - the composition root registers every table (foreign keys)
from app.auth.endpoints import router as keys_router
from app.auth.middleware import AuthenticateFirst
from app.billing.endpoints import customer_router as billing_customer_router
from app.billing.endpoints import router as invoices_router
from app.budgets.endpoints import router as budgets_router
from app.core.db import get_engine
from app.core.errors import document_errors, install_error_handlers
from app.core.health import router as health_router
from app.core.limits import RequestLimits
from app.customers.endpoints import router as customers_router
from app.dashboard import endpoints as dashboard
from app.events.endpoints import router as events_router
from app.fleet.endpoints import router as fleet_router
from app.metering.endpoints import router as metering_router
from app.payments.endpoints import router as stripe_router
from app.payments.stripe_mirror import stripe_sync_lifespan
from app.plans.endpoints import router as plans_router
from app.rentals.endpoints import router as rentals_router
from app.wiring import install as install_subscribers

ROUTERS = [
    health_router,
    keys_router,
    customers_router,
    dashboard.router,
    dashboard.pages,
    events_router,
    fleet_router,
    invoices_router,
    billing_customer_router,
    budgets_router,
    metering_router,
    plans_router,
    rentals_router,
    stripe_router,
]


def create_app(engine: Engine | None = None) -> FastAPI:
    # Swagger UI and ReDoc from packaged assets: /docs works offline (no CDN).
    app = FastAPIOffline(
        title="gpumeter",
        version="0.1.0",
        description="Per-second GPU metering and billing: console API, ingest, invoices.",
        lifespan=stripe_sync_lifespan,  # the Stripe sync worker, when Stripe is configured
        favicon_url="/favicon.ico",
    )
    app.state.engine = engine or get_engine()
    install_subscribers()
    install_error_handlers(app)
    dashboard.install(app)
    # Outermost first on the way in: size and concurrency limits, then the key, then the app.
    app.add_middleware(AuthenticateFirst)
    app.add_middleware(RequestLimits)
    for router in ROUTERS:
        app.include_router(router)
    document_errors(app)
    return app


def app_from_environment() -> FastAPI:
    """Entry point for uvicorn workers (`factory=True`): settings come from the environment."""
    from app.core.logging import configure_logging
    from app.settings import get_settings

    configure_logging(get_settings().log_level)
    return create_app()
