"""The NATS JetStream stream, for real (NATS with JetStream at 127.0.0.1:4222)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from typing import Any

import nats
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from app.core.db import transaction
from app.events import service, stream
from app.main import create_app
from app.settings import Settings, get_settings
from tests.harness import wait_for

NATS_URL = "nats://127.0.0.1:4222"


@pytest.fixture
def nats_settings(monkeypatch: pytest.MonkeyPatch) -> Iterator[Settings]:
    """Events to a stream of this test's own, removed afterwards."""
    name = f"test_{uuid.uuid4().hex[:12]}"
    monkeypatch.setenv("GPUMETER_NATS_URL", NATS_URL)
    monkeypatch.setenv("GPUMETER_NATS_STREAM", name)
    monkeypatch.setenv("GPUMETER_NATS_SUBJECT_PREFIX", f"{name}.events")
    get_settings.cache_clear()
    service.subscribe(service.ALL_TYPES, stream.queue_publication)
    yield get_settings()
    service.unsubscribe(service.ALL_TYPES, stream.queue_publication)
    asyncio.run(_delete_stream(name))
    get_settings.cache_clear()


async def _delete_stream(name: str) -> None:
    client = await nats.connect(NATS_URL)
    try:
        await client.jetstream().delete_stream(name)
    except nats.js.errors.NotFoundError:
        pass
    finally:
        await client.close()


async def _consume(settings: Settings, count: int) -> list[dict[str, Any]]:
    """Every message of the stream, in stream order, through a JetStream pull consumer."""
    client = await nats.connect(NATS_URL)
    try:
        consumer = await client.jetstream().pull_subscribe(
            f"{settings.nats_subject_prefix}.>", durable="test", stream=settings.nats_stream
        )
        messages = await consumer.fetch(count, timeout=5)
        for message in messages:
            await message.ack()
        return [json.loads(m.data) | {"_subject": m.subject} for m in messages]
    finally:
        await client.close()


async def _stored(settings: Settings) -> int:
    client = await nats.connect(NATS_URL)
    try:
        info = await client.jetstream().stream_info(settings.nats_stream)
        return info.state.messages
    except nats.js.errors.NotFoundError:
        return 0
    finally:
        await client.close()


def test_a_jetstream_consumer_gets_every_event_in_order_per_aggregate(
    db: Engine, nats_settings: Settings
) -> None:
    published: list[tuple[str, str]] = []
    with TestClient(create_app(db, worker=True)):
        for batch in range(4):
            with transaction(db) as session:
                for n in range(6):  # three aggregates, interleaved
                    event = service.publish(
                        session, "test.happened", {"n": batch * 6 + n}, subject=f"thing/{n % 3}"
                    )
                    published.append((event.subject, str(event.id)))
        wait_for(lambda: asyncio.run(_stored(nats_settings)) == 24, "24 messages in the stream")
    received = asyncio.run(_consume(nats_settings, 24))
    assert {m["_subject"] for m in received} == {
        f"{nats_settings.nats_subject_prefix}.test.happened"
    }
    assert sorted(m["id"] for m in received) == sorted(event_id for _, event_id in published)
    for aggregate in ("thing/0", "thing/1", "thing/2"):
        sent = [event_id for subject, event_id in published if subject == aggregate]
        assert [m["id"] for m in received if m["subject"] == aggregate] == sent
