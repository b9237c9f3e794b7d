"""`GET /metrics`: Prometheus text with the queue's depth read from the database."""

from __future__ import annotations

from fastapi.testclient import TestClient
from sqlalchemy import Engine

from app.core.db import transaction
from app.core.queue import defer
from app.payments.jobs import sync_stripe
from tests.harness import bearer


def test_metrics_show_the_queue_depth_by_task_and_status(
    client: TestClient, db: Engine, admin_key: str
) -> None:
    with transaction(db) as session:
        defer(session, sync_stripe)
        defer(session, sync_stripe)
    assert client.get("/metrics").status_code == 401  # not public by default
    response = client.get("/metrics", headers=bearer(admin_key))
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    lines = response.text.splitlines()
    # Two asked for, one waits: the task's queueing lock absorbed the second.
    assert 'gpumeter_queue_jobs{status="todo",task="payments:sync_stripe"} 1.0' in lines
    assert any(line.startswith("# TYPE gpumeter_webhook_attempts_total") for line in lines)
