"""Service settings, read from the environment (prefix ``GPUMETER_``); Alembic reads the same."""

from __future__ import annotations

import os
import secrets
from contextlib import suppress
from decimal import Decimal
from functools import lru_cache
from pathlib import Path

import platformdirs
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GPUMETER_", extra="ignore")

    database_url: str | None = Field(
        default=None,
        description="Postgres URL (`postgresql://user@host:port/db`). Unset: an embedded "
        "Postgres runs in the data dir.",
    )
    data_dir: Path = Field(
        default=Path(platformdirs.user_data_dir("gpumeter")),
        # The default depends on the user and the platform: the docs name it in words.
        json_schema_extra={"doc_default": "the user data dir (`~/.local/share/gpumeter`)"},
        description="Where the embedded Postgres keeps its data when no database URL is set "
        "(`--data-dir` overrides).",
    )
    db_pool_size: int = Field(
        default=10,
        ge=1,
        description="Connections per worker process (plus as many overflow connections).",
    )
    db_pool_timeout_s: float = Field(
        default=2.0,
        gt=0,
        description="Longest wait for a pool connection; then 503 with `Retry-After`.",
    )
    max_in_flight: int | None = Field(
        default=None,
        ge=1,
        description="Requests one worker runs at once, ingest apart; unset: the pool's "
        "connections (twice `GPUMETER_DB_POOL_SIZE`), so threads and connections "
        "cannot deadlock.",
    )
    queue_wait_s: float = Field(
        default=2.0,
        ge=0,
        description="Longest wait for a request slot; then 503 with `Retry-After` (shed, in "
        "the JSON error shape).",
    )
    max_body_bytes: int = Field(
        default=16 * 2**20,
        ge=1024,
        description="Largest request body: a larger one is 413 before it is read (declared) "
        "or as it streams (chunked).",
    )
    body_read_timeout_s: float = Field(
        default=30.0, gt=0, description="Longest pause while a request body arrives; then 408."
    )
    body_min_rate: float = Field(
        default=1024.0,
        gt=0,
        description="Bytes a second a request body must average once its first "
        "`GPUMETER_BODY_READ_TIMEOUT_S` have passed; a slower one (a trickle) "
        "gets 408 and its connection closed.",
    )
    body_deadline_s: float = Field(
        default=120.0,
        gt=0,
        description="Longest a request body may take in all, however it arrives; then 408 and "
        "the connection closed.",
    )
    header_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="A connection whose request headers are not complete by then is closed.",
    )
    keep_alive_s: int = Field(
        default=20,
        ge=1,
        description="An idle keep-alive connection is closed after this. Keep it above the "
        "agents' upload interval (10 s by default), or every upload opens a new connection.",
    )
    shutdown_timeout_s: int = Field(
        default=5,
        ge=1,
        description="On SIGTERM, how long running requests may finish before the workers "
        "exit; one still running then is answered 503 with `Retry-After`.",
    )
    forwarded_allow_ips: str = Field(
        default="127.0.0.1,::1",
        description="Proxies whose `X-Forwarded-For` and `X-Forwarded-Proto` are trusted "
        "(uvicorn's `forwarded_allow_ips`: comma-separated addresses or networks, "
        "`*` for any): behind a load balancer, set its address (or network) so "
        "each client is throttled and logged by its own address, not the proxy's; "
        "a header from any other peer is ignored.",
    )
    idempotency_key_ttl_s: int = Field(
        default=24 * 3600,
        ge=60,
        le=30 * 24 * 3600,
        description="How long a POST's `Idempotency-Key` and its answer are kept (60 s to 30 "
        "days): a retry within it gets the first answer; expired keys are purged "
        "by a periodic job, at most 10,000 every 5 minutes.",
    )
    log_level: str = Field(
        default="info",
        description="`debug`, `info`, `warning` or `error`; logs are JSON lines on stderr.",
    )
    auth_revocation_check_s: float = Field(
        default=5.0,
        gt=0,
        description="API keys are cached per process; every this many seconds the cached ones "
        "are re-verified, so a revoked key stops working everywhere within this "
        "bound (at once on the process that revoked it).",
    )
    db_idle_ping_s: float = Field(
        default=30.0,
        gt=0,
        description="A pooled connection idle this long is pinged before use; busy ones are "
        "not (a connection the server ended shows it on its socket and is "
        "replaced before use, see `app.core.db`).",
    )
    ingest_writers: int = Field(
        default=1,
        ge=1,
        description="Threads per worker process that store ingest batches; batches that "
        "arrive while they write are stored together, one transaction for many "
        "(group commit). One makes the largest groups: a second split them and "
        "contends for the GIL (677 against 893 batches/s served at saturation, "
        "`bench/HISTORY.md`).",
    )
    ingest_group_max: int = Field(
        default=32, ge=1, description="Most ingest batches stored in one transaction."
    )
    ingest_in_flight: int = Field(
        default=64,
        ge=1,
        description="Ingest requests one worker runs at once, in slots of their own (they "
        "hold no database connection while they wait: the writers do), and the "
        "most batches its writers' queue holds; past it 503 with `Retry-After`. "
        "At most this many bodies in memory.",
    )
    ingest_wait_s: float = Field(
        default=8.0,
        gt=0,
        description="Longest an ingest batch waits to be stored; then 503 with `Retry-After` "
        "(below the agent's 10-s timeout: it re-sends, and what was stored "
        "meanwhile counts as duplicates).",
    )
    max_clock_skew_s: int = Field(
        default=10, ge=0, description="How far in the future a telemetry timestamp may be."
    )
    ingest_max_items: int = Field(
        default=20_000, ge=1, description="Most records plus events in one ingest batch."
    )
    ingest_retention_days: int = Field(
        default=400, ge=1, description="How old telemetry may be and still be accepted."
    )
    telemetry_retention_days: int = Field(
        default=400,
        ge=1,
        description="Days telemetry (state segments, hourly metrics, health events) is kept; "
        "a month's partition is dropped whole once all of it is older.",
    )
    invoice_grace_hours: int = Field(
        default=6,
        ge=0,
        description="Hours after a period ends before its invoices may be finalized.",
    )
    idle_util_threshold_percent: float = Field(
        default=1.0, ge=0, description="A minute with mean GPU utilisation below this is idle."
    )
    manual_recovery_s: int = Field(
        default=47 * 60,
        ge=0,
        description="What-if: the downtime a manual failure process costs (47 min).",
    )
    public_url: str | None = Field(
        default=None,
        pattern=r"^https?://[^/?#\s]+(/[^?#\s]*)?$",
        max_length=500,
        description="The service's address as customers reach it "
        "(`https://meter.example.com`): the base of the absolute links it hands "
        "out (portal links). Unset: those links are paths on this site. The "
        "`Host` header is never used for links or redirects.",
    )
    metrics_public: bool = Field(
        default=False,
        description="Serve `GET /metrics` without a key (to a scraper on a private network); "
        "by default it takes an admin key (`Authorization: Bearer gm_admin_…`). "
        "`gpumeter worker --metrics-port` and the agent's `--metrics-port` are "
        "unaffected.",
    )
    provider_name: str = Field(
        default="gpumeter",
        max_length=200,
        description="The GPU cloud's name in cost exports (FOCUS `ProviderName`, "
        "`InvoiceIssuerName`).",
    )
    stripe_api_key: str | None = Field(default=None, description="Enables the Stripe mirror.")
    stripe_webhook_secret: str | None = Field(
        default=None, description="Verifies Stripe webhook signatures."
    )
    stripe_api_base: str | None = Field(
        default=None, description="Stripe API address; unset: Stripe's own (tests: a fake)."
    )
    stripe_max_network_retries: int = Field(
        default=2,
        ge=0,
        description="Immediate SDK retries of one Stripe call (same idempotency key).",
    )
    stripe_retry_base_s: float = Field(
        default=2.0, gt=0, description="First delay before the sync retries an invoice."
    )
    stripe_retry_max_s: float = Field(
        default=300.0, gt=0, description="Longest delay between the sync's retries of an invoice."
    )
    stripe_lease_s: int = Field(
        default=300, ge=1, description="How long a sync worker owns an outbox item it claimed."
    )
    seller_name: str = Field(default="gpumeter", description="The seller's name on invoices.")
    seller_address: str = Field(
        default="",
        description="The seller's postal address on invoices (lines separated by newlines).",
    )
    seller_tax_id: str = Field(default="", description="The seller's VAT / tax id on invoices.")
    worker_in_process: bool = Field(
        default=True,
        description="Run a job-queue worker inside each service process (the single box); "
        "false (or `gpumeter serve --no-worker`) when `gpumeter worker` processes "
        "run separately.",
    )
    worker_concurrency: int = Field(
        default=4, ge=1, le=64, description="Jobs one worker runs at once."
    )
    worker_shutdown_s: float = Field(
        default=10.0,
        ge=0,
        description="On SIGTERM, how long running jobs may finish before they are aborted "
        "(re-run later).",
    )
    worker_heartbeat_s: float = Field(default=10.0, gt=0, description="Worker heartbeat period.")
    worker_stalled_s: float = Field(
        default=30.0,
        gt=0,
        description="A worker silent this long is dead: its running jobs are queued again.",
    )
    worker_poll_s: float = Field(
        default=5.0,
        gt=0,
        description="Longest wait between job polls (LISTEN/NOTIFY wakes workers at once).",
    )
    webhook_allow_private: bool = Field(
        default=False,
        description="Allow webhook URLs on addresses other than global unicast: loopback, "
        "private, link-local, multicast or reserved (tests on 127.0.0.1 set it).",
    )
    webhook_timeout_s: float = Field(
        default=10.0, gt=0, le=60, description="One delivery attempt's timeout."
    )
    webhook_retry_base_s: float = Field(
        default=5.0,
        gt=0,
        description="First delay before a failed delivery is retried; each next one three "
        "times as long.",
    )
    webhook_retry_max_s: float = Field(
        default=6 * 3600.0, gt=0, description="Longest delay between retries of a delivery (6 h)."
    )
    webhook_retry_window_s: float = Field(
        default=3 * 86400.0,
        gt=0,
        description="How long a delivery is retried before it fails (3 days: 20 attempts).",
    )
    webhook_disable_after_s: float = Field(
        default=5 * 86400.0,
        ge=0,
        description="An endpoint whose every attempt failed this long (5 days) is disabled, "
        "with a `webhook_endpoint.disabled` event.",
    )
    invoice_schedule_finalize: bool = Field(
        default=True,
        description="The scheduled monthly run finalizes the drafts (false: drafts only).",
    )
    invoice_schedule_cron: str = Field(
        default="*/5 * * * *",
        description="When workers look for months whose grace time is over (cron; a 6th field "
        "is seconds).",
    )
    rollup_schedule_cron: str = Field(
        default="7 * * * *",
        description="When workers store the usage rollups of the closed days and of the open "
        "day's closed hours, so that no reader rates them (cron; hourly, a few "
        "minutes past the hour, reaches every zone's midnight and each hour once "
        "it is in).",
    )
    nats_url: str | None = Field(
        default=None,
        description="A NATS server with JetStream; set: every event is also published there.",
    )
    nats_stream: str = Field(
        default="GPUMETER_EVENTS", description="The JetStream stream (created if missing)."
    )
    nats_subject_prefix: str = Field(
        default="gpumeter.events", description="Events go to `<prefix>.<type>`."
    )
    # --- failover (app.failover) ---
    failover_reservation_ttl_s: int = Field(
        default=120,
        ge=1,
        le=86_400,
        description="How long a failover holds its spare unconfirmed; then it expires "
        "(`failover.expired`) and the spare is free again.",
    )
    spare_target_percent: Decimal = Field(
        default=Decimal(5),
        ge=0,
        le=100,
        description="Hot-spare share per GPU model and datacenter where no policy (`PUT "
        "/v1/spare-policies`) says otherwise.",
    )
    # --- prepaid balance (app.balances) ---
    trial_credit: Decimal = Field(
        default=Decimal("10.00"),
        ge=0,
        max_digits=12,
        decimal_places=3,
        description="Signup credit granted once to each new customer when it is created, in "
        "its currency (0: none).",
    )
    balance_low_threshold: Decimal = Field(
        default=Decimal("2.00"),
        ge=0,
        max_digits=12,
        decimal_places=3,
        description="A prepaid balance falling below this publishes `balance.low`.",
    )
    # --- abuse limits: failed authentication, fleet admission, per-customer caps, secrets ---
    auth_failures_per_window: int = Field(
        default=20,
        ge=1,
        description="Failed authentications one client address, or one key, may make per "
        "window; past it that key, and any invalid key from that address, get 429 "
        "with `Retry-After` until the window ends (per process). A valid key is "
        "always served: no client's failures lock out another's key.",
    )
    auth_failure_window_s: float = Field(
        default=60.0,
        gt=0,
        description="The window of `GPUMETER_AUTH_FAILURES_PER_WINDOW`, in seconds.",
    )
    auth_throttle_tracked: int = Field(
        default=100_000,
        ge=1,
        description="Most client addresses (and, apart, keys) whose failures a process "
        "remembers; past it the least recently seen are forgotten first (bounded "
        "memory).",
    )
    gpu_auto_admit: bool = Field(
        default=False,
        description="GPUs a node reports for the first time are rentable at once (a fleet "
        "whose nodes are trusted); false: they wait in the `quarantine` pool, "
        "metered but never assigned, until an operator admits them (`PATCH "
        '/v1/gpus/{uuid}` with `{"pool": "rentable"}`). GPUs an operator '
        "registers (`POST /v1/gpus`) take the pool given.",
    )
    max_gpus_per_node: int = Field(
        default=16,
        ge=1,
        description="Most GPUs one node may have; a batch that would register more is refused "
        "(403), so a node token cannot flood the fleet with made-up GPUs.",
    )
    ingest_hold_max: int = Field(
        default=50_000,
        ge=0,
        description="Most records plus events held per GPU in dispute (two nodes claimed its "
        "UUID) until an operator settles the clash (about a day of one GPU's 2-s "
        "rounds); past it they are refused, each answered so.",
    )
    max_budgets_per_customer: int = Field(
        default=50, ge=1, description="Most budgets one customer may have (409 past it)."
    )
    encryption_keys: list[str] = Field(
        default=[],
        description="Fernet keys (a JSON list, newest first) that encrypt secrets kept in the "
        "database (webhook signing secrets; the answers kept for idempotency "
        "keys, for their 24 h): the first encrypts, every one decrypts. Empty: "
        "one key derived (HKDF-SHA256) from `GPUMETER_SECRET_KEY`, so a separate "
        "`gpumeter worker` needs the service's secret key (or these keys) too. "
        "Rotation: docs/operations.md.",
    )
    secret_key: str | None = Field(
        default=None,
        min_length=16,
        description="Signs customer portal links and session cookies (at least 16 characters, "
        "the same for every instance). Required with `GPUMETER_DATABASE_URL` "
        "(`gpumeter serve` exits 2 without it); the embedded default generates "
        "one once in the data dir (`secret_key`, mode 0600).",
    )

    @property
    def requests_in_flight(self) -> int:
        return self.max_in_flight or 2 * self.db_pool_size


@lru_cache
def get_settings() -> Settings:
    return Settings()


SECRET_KEY_FILE = "secret_key"


def embedded_secret_key(data_dir: Path) -> str:
    """The single-box default's signing secret: random, made once, kept in ``data_dir`` (0600)."""
    path = data_dir / SECRET_KEY_FILE
    if not path.exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        # O_EXCL: two processes starting at once cannot both write (the loser reads the winner's).
        with suppress(FileExistsError):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(secrets.token_urlsafe(32))
    return path.read_text().strip()


def sqlalchemy_url(url: str) -> str:
    """Accept plain ``postgresql://`` URLs and use the psycopg 3 driver for them."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url.removeprefix(prefix)
    return url
