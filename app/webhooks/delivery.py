"""One delivery attempt: prepare it, POST it, record what came of it.

At least once: a delivery is retried until the endpoint answers 2xx or the retry window
(``webhook_retry_window_s``, three days) has passed, with exponential backoff (``base`` x 3^n,
at most ``webhook_retry_max_s``). Every attempt of one event to one endpoint carries the same
``webhook-id`` (the event id), so the receiver can drop duplicates, such as a re-send after a
worker died between the receiver's 2xx and our record of it. Each job carries the attempt
number it is for; a job that finds the delivery past that number (it was recorded already,
or re-sent) does nothing, so one delivery never has two retry chains.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import httpx
from prometheus_client import Counter, Histogram
from sqlalchemy.orm import Session

from app.events.schemas import EventRead
from app.events.service import get_event, publish
from app.settings import Settings
from app.webhooks import repository, signing
from app.webhooks.models import DeliveryStatus, WebhookAttempt, WebhookEndpoint
from app.webhooks.targets import RefusedTarget, Target, check_target

ATTEMPTS = Counter(
    "gpumeter_webhook_attempts_total", "Webhook delivery attempts by outcome.", ["outcome"]
)
LATENCY = Histogram(
    "gpumeter_webhook_delivery_latency_seconds",
    "From an event's time to the 2xx of its delivery (retries included).",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 3600, 86400),
)
# One client (its TLS context) for every delivery of this process; httpx clients are
# thread-safe. Redirects are not followed: a 3xx is a failed attempt. No kept-alive
# connections: a delivery connects to the address its check resolved (``pinned``), and a pool
# keyed by address could carry one host's request over a connection made for another name.
_CLIENT = httpx.Client(follow_redirects=False, limits=httpx.Limits(max_keepalive_connections=0))


@dataclass(frozen=True)
class Request:
    url: str
    body: str
    message_id: str
    secrets: list[str]
    event_at: datetime


@dataclass(frozen=True)
class Outcome:
    status_code: int | None
    error: str | None
    duration_ms: int

    @property
    def succeeded(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300


def _now() -> datetime:
    return datetime.now(UTC)


def prepare(session: Session, delivery_id: int, attempt: int) -> Request | None:
    """What to send for attempt ``attempt`` of the delivery; None when there is nothing to do
    (done, re-sent meanwhile, or its endpoint was disabled: then it is marked failed)."""
    delivery = repository.locked_delivery(session, delivery_id)
    if delivery is None or delivery.status != DeliveryStatus.PENDING:
        return None
    if delivery.attempts != attempt:
        return None
    endpoint = session.get_one(WebhookEndpoint, delivery.endpoint_id)
    if not endpoint.enabled:
        delivery.status, delivery.next_attempt_at = DeliveryStatus.FAILED, None
        delivery.last_error = "the endpoint is disabled"
        return None
    event = get_event(session, delivery.event_id)
    return Request(
        url=endpoint.url,
        body=EventRead.model_validate(event).model_dump_json(),
        message_id=str(event.id),
        secrets=_signing_secrets(endpoint, _now()),
        event_at=event.occurred_at,
    )


def _signing_secrets(endpoint: WebhookEndpoint, now: datetime) -> list[str]:
    expires = endpoint.previous_secret_expires_at
    if endpoint.previous_secret and expires and expires > now:
        return [endpoint.secret, endpoint.previous_secret]
    return [endpoint.secret]


def send(request: Request, settings: Settings) -> Outcome:
    """POST the event; the answer's status only (its body is never read)."""
    started = time.perf_counter()
    try:
        target = check_target(request.url, allow_private=settings.webhook_allow_private)
        headers = signing.headers(request.message_id, _now(), request.body, request.secrets)
        url, host = pinned(request.url, target)
        with _CLIENT.stream(
            "POST",
            url,
            content=request.body,
            headers={**headers, "Host": host},
            timeout=settings.webhook_timeout_s,
            extensions={"sni_hostname": target.host},
        ) as answer:
            status, error = answer.status_code, None
    except RefusedTarget as refused:
        status, error = None, f"refused: {refused}"
    except httpx.HTTPError as failure:
        status, error = None, f"{type(failure).__name__}: {failure}"[:500]
    duration_ms = round((time.perf_counter() - started) * 1000)
    if status is not None and not 200 <= status < 300:
        error = f"HTTP {status}"
    outcome = Outcome(status, error, duration_ms)
    ATTEMPTS.labels("succeeded" if outcome.succeeded else "failed").inc()
    if outcome.succeeded:
        LATENCY.observe((_now() - request.event_at).total_seconds())
    return outcome


def pinned(url: str, target: Target) -> tuple[httpx.URL, str]:
    """The URL with the checked address in place of its host (no second name lookup, so no
    DNS rebinding), and the Host header that names the host; TLS's SNI and certificate check
    use the name too (the ``sni_hostname`` extension)."""
    original = httpx.URL(url)
    host = original.netloc.decode("ascii")  # host[:port] (credentials are refused)
    return original.copy_with(host=str(target.address)), host


def record(
    session: Session, delivery_id: int, attempt: int, outcome: Outcome, settings: Settings
) -> datetime | None:
    """Log the attempt, update the delivery and its endpoint; when to retry, if at all."""
    delivery = repository.locked_delivery(session, delivery_id)
    if delivery is None or delivery.attempts != attempt:
        return None  # recorded by a job that ran before us (we were a stalled re-run)
    now = _now()
    delivery.attempts += 1
    session.add(
        WebhookAttempt(
            delivery_id=delivery.id,
            number=delivery.attempts,
            at=now,
            status_code=outcome.status_code,
            error=outcome.error,
            duration_ms=outcome.duration_ms,
        )
    )
    delivery.last_status_code, delivery.last_error = outcome.status_code, outcome.error
    endpoint = session.get_one(WebhookEndpoint, delivery.endpoint_id, with_for_update=True)
    if outcome.succeeded:
        delivery.status, delivery.delivered_at, delivery.next_attempt_at = (
            DeliveryStatus.SUCCEEDED,
            now,
            None,
        )
        endpoint.failure_streak, endpoint.failing_since = 0, None
        return None
    _count_failure(session, endpoint, now, settings)
    retry_at = now + timedelta(seconds=backoff_s(delivery.attempts, settings))
    window_end = delivery.retrying_since + timedelta(seconds=settings.webhook_retry_window_s)
    if retry_at > window_end or not endpoint.enabled:
        delivery.status, delivery.next_attempt_at = DeliveryStatus.FAILED, None
        return None
    delivery.next_attempt_at = retry_at
    return retry_at


def backoff_s(attempts: int, settings: Settings) -> float:
    """Delay after the ``attempts``-th failed attempt: base, 3 x base, 9 x base, ... capped."""
    return float(
        min(settings.webhook_retry_base_s * 3 ** (attempts - 1), settings.webhook_retry_max_s)
    )


def _count_failure(
    session: Session, endpoint: WebhookEndpoint, now: datetime, settings: Settings
) -> None:
    """Extend the endpoint's failure streak; one that has lasted ``webhook_disable_after_s``
    disables the endpoint, with a ``webhook_endpoint.disabled`` event saying so."""
    endpoint.failure_streak += 1
    endpoint.failing_since = endpoint.failing_since or now
    failing_for = (now - endpoint.failing_since).total_seconds()
    if not endpoint.enabled or failing_for < settings.webhook_disable_after_s:
        return
    endpoint.enabled = False
    endpoint.disabled_reason = (
        f"{endpoint.failure_streak} failed attempts in a row since "
        f"{endpoint.failing_since.isoformat()}"
    )
    session.flush()
    data = {
        "endpoint_id": endpoint.id,
        "url": endpoint.url,
        "failure_streak": endpoint.failure_streak,
        "failing_since": endpoint.failing_since.isoformat(),
        "reason": endpoint.disabled_reason,
    }
    subject = f"webhook_endpoint/{endpoint.id}"
    publish(
        session,
        "webhook_endpoint.disabled",
        data,
        subject=subject,
        customer_id=endpoint.customer_id,
    )
