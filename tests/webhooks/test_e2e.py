"""Delivery guarantees with real `gpumeter worker` processes: a receiver that was down, a worker
killed mid-delivery, two workers sharing the deliveries."""

from __future__ import annotations

import signal
import threading
import time
import uuid
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from app.core.db import transaction
from app.events.service import publish
from tests.core.workers import start_worker, workers
from tests.harness import Console, wait_for
from tests.webhooks.conftest import FAST_RETRIES, register
from tests.webhooks.receiver import Receiver

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("settings")]


def publish_events(db: Engine, count: int) -> list[str]:
    with transaction(db) as session:
        published = [
            publish(session, "test.happened", {"n": n}, subject=f"thing/{n % 3}")
            for n in range(count)
        ]
        return [str(event.id) for event in published]


# Eight times the retry cap (FAST_RETRIES): the deliveries are retried, each several times.
OUTAGE_S = 8


def failed_attempts(db: Engine) -> list[int]:
    """Per delivery, its attempts so far (none succeeded yet while the receiver is down)."""
    with db.connect() as connection:
        return list(connection.scalars(text("SELECT attempts FROM webhook_deliveries")))


def test_every_event_arrives_after_the_receiver_was_down(
    console: Console, db: Engine, database_url: str, receiver: Receiver, tmp_path: Path
) -> None:
    register(console, receiver, "/hooks")
    receiver.stop()
    down_since = time.monotonic()
    with workers(database_url, tmp_path, settings=FAST_RETRIES):
        published = publish_events(db, 20)
        wait_for(
            lambda: (
                time.monotonic() - down_since >= OUTAGE_S
                and min(failed_attempts(db), default=0) >= 3
            ),
            "an outage of failed attempts of every delivery",
            timeout_s=90,
        )
        receiver.start()
        wait_for(lambda: set(receiver.ids("/hooks")) == set(published), "every event", 60)
    assert receiver.rejected == []
    assert sorted(receiver.ids("/hooks")) == sorted(published)  # each once, once it was back


def test_a_worker_killed_mid_delivery_loses_nothing(
    console: Console, db: Engine, database_url: str, receiver: Receiver, tmp_path: Path
) -> None:
    register(console, receiver, "/hooks")
    receiver.hold = held = threading.Event()
    first = start_worker(database_url, tmp_path / "first.log", FAST_RETRIES)
    try:
        published = publish_events(db, 5)
        wait_for(lambda: receiver.held_requests >= 1, "a delivery in flight", timeout_s=60)
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
    finally:
        if first.poll() is None:
            first.kill()
        receiver.hold = None
        held.set()
    with workers(database_url, tmp_path, settings=FAST_RETRIES):
        wait_for(lambda: set(receiver.ids("/hooks")) == set(published), "every event", 60)
    assert receiver.rejected == []
    # The same ids (each event's id is its webhook-id), every event delivered, none invented.
    assert set(receiver.ids("/hooks")) == set(published)
    assert all(uuid.UUID(message_id) for message_id in receiver.ids("/hooks"))


def test_two_workers_deliver_each_event_to_each_endpoint_one_at_a_time(
    console: Console, db: Engine, database_url: str, receiver: Receiver, tmp_path: Path
) -> None:
    register(console, receiver, "/a")
    register(console, receiver, "/b")
    receiver.delay_s = 0.05  # a slow endpoint, so overlapping deliveries would show
    with workers(database_url, tmp_path, count=2, settings=FAST_RETRIES):
        published = publish_events(db, 30)
        wait_for(lambda: min(len(receiver.ids("/a")), len(receiver.ids("/b"))) >= 30, "all", 90)
    assert receiver.overlaps == []
    assert receiver.rejected == []
    for path in ("/a", "/b"):
        assert sorted(receiver.ids(path)) == sorted(published)  # each once: nothing crashed
    logs = [(tmp_path / f"worker-{n}.log").read_text() for n in range(2)]
    assert all("webhooks:deliver" in log and "Success" in log for log in logs)  # both worked
