"""Preempting a rental (the failover's call): only a preemptible one, ended at that second."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sqlalchemy import Engine

from app.core.db import transaction
from app.core.errors import Conflict
from app.rentals import service
from tests.harness import Console

AT = datetime(2026, 11, 2, 3, 4, 5, tzinfo=UTC)


def test_only_a_preemptible_rental_is_preempted(console: Console, db: Engine) -> None:
    customer = console.customer()["id"]
    prices = [
        {
            "gpu_model": "H100",
            "price_per_hour": "2.49",
            "preemptible_price_per_hour": "0.99",
            "effective_from": "2026-01-01T00:00:00Z",
        }
    ]
    plan = console.post("/v1/plans", {"name": "spot", "prices": prices})["id"]
    regular = console.rental(customer, plan)["id"]
    spot = console.rental(customer, plan, preemptible=True)["id"]
    with transaction(db) as session:
        with pytest.raises(Conflict, match="is not preemptible"):
            service.preempt(session, service.rental_by_id(session, regular), AT, "test")
        ended = service.preempt(session, service.rental_by_id(session, spot), AT, "test")
        assert (ended.end_at, ended.preempted_at) == (AT, AT)
    read = console.client.get(f"/v1/rentals/{spot}", headers=console.headers).json()
    assert (read["preemptible"], read["end_at"]) == (True, "2026-11-02T03:04:05Z")
