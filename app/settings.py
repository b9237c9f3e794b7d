"""Service settings, read from the environment (prefix ``GPUMETER_``); Alembic reads the same."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import platformdirs
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GPUMETER_", extra="ignore")

    database_url: str | None = Field(
        default=None,
        description="Postgres URL (postgresql://user@host:port/db). Unset: an embedded Postgres "
        "is started in data_dir.",
    )
    data_dir: Path = Field(
        default=Path(platformdirs.user_data_dir("gpumeter")),
        description="Where the embedded Postgres keeps its data when no database_url is set.",
    )
    db_pool_size: int = Field(default=10, ge=1, description="Connections per worker process.")
    log_level: str = Field(default="info", description="debug, info, warning or error.")
    max_clock_skew_s: int = Field(
        default=10, ge=0, description="How far in the future a telemetry timestamp may be."
    )
    ingest_max_items: int = Field(
        default=20_000, ge=1, description="Most records plus events one ingest batch may carry."
    )
    ingest_retention_days: int = Field(
        default=400, ge=1, description="How old telemetry may be and still be accepted."
    )
    invoice_grace_hours: int = Field(
        default=6, ge=0, description="Hours after a period ends before its invoices may finalize."
    )
    idle_util_threshold_percent: float = Field(
        default=1.0, ge=0, description="A minute with mean GPU utilisation below this is idle."
    )
    manual_recovery_s: int = Field(
        default=47 * 60, ge=0, description="What-if: downtime a manual failure process costs."
    )
    provider_name: str = Field(
        default="gpumeter",
        max_length=200,
        description="The GPU cloud's name in cost exports (FOCUS ProviderName, InvoiceIssuerName).",
    )
    stripe_api_key: str | None = Field(default=None, description="Enables the Stripe mirror.")
    stripe_webhook_secret: str | None = Field(default=None, description="Verifies Stripe webhooks.")
    stripe_api_base: str | None = Field(
        default=None, description="Stripe API address; unset: Stripe's own (tests: a fake)."
    )
    stripe_max_network_retries: int = Field(
        default=2, ge=0, description="Immediate SDK retries of one Stripe call (same key)."
    )
    stripe_retry_base_s: float = Field(
        default=2.0, gt=0, description="First delay before the sync retries an invoice."
    )
    stripe_retry_max_s: float = Field(
        default=300.0, gt=0, description="Longest delay between the sync's retries of an invoice."
    )
    stripe_poll_interval_s: float = Field(
        default=5.0, gt=0, description="How often the Stripe sync worker polls its outbox."
    )
    stripe_sync_in_process: bool = Field(
        default=True, description="Run the Stripe sync worker inside each service process."
    )
    stripe_lease_s: int = Field(
        default=300, ge=1, description="How long a sync worker owns an outbox item it claimed."
    )
    secret_key: str = Field(
        default="change-me-in-production",
        description="Signs customer portal links and session cookies.",
    )


@lru_cache
def get_settings() -> Settings:
    return Settings()


def sqlalchemy_url(url: str) -> str:
    """Accept plain ``postgresql://`` URLs and use the psycopg 3 driver for them."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url.removeprefix(prefix)
    return url
