"""The customer-GPU visibility statement: assignment intervals, filtered and clipped to a window
by overlap, exactly as every reader (GPU lists, telemetry, rating, the dashboard) sees them."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from sqlalchemy import Engine, Select

from app.core.db import transaction
from app.rentals.reads import served
from tests.harness import Console

Intervals = Select[uuid.UUID, uuid.UUID, str, datetime, datetime | None]


def at(day: int, hour: int = 0) -> datetime:
    return datetime(2026, 11, day, hour, tzinfo=UTC)


def rows(db: Engine, query: Intervals) -> list[tuple[str, datetime, datetime | None]]:
    with transaction(db) as session:
        ordered = session.execute(query.order_by("start_at"))
        return [(gpu, start, end) for _, _, gpu, start, end in ordered]


def test_served_is_the_assignments_of_a_customer_overlapping_a_window(
    console: Console, db: Engine
) -> None:
    acme, other = console.customer("Acme AI"), console.customer("Other Co")
    plan = console.plan()
    node = console.node()
    for gpu in ("GPU-1", "GPU-2", "GPU-3"):
        console.gpu(node["node"]["id"], gpu)
    rental = console.rental(acme["id"], plan["id"])
    console.assign(rental["id"], "GPU-1", "2026-11-01T00:00:00Z", end_at="2026-11-03T00:00:00Z")
    console.assign(rental["id"], "GPU-2", "2026-11-03T00:00:00Z")  # still running
    theirs = console.rental(other["id"], plan["id"])
    console.assign(theirs["id"], "GPU-3", "2026-11-01T00:00:00Z")
    acme_id = uuid.UUID(acme["id"])

    assert rows(db, served(customer_id=acme_id)) == [
        ("GPU-1", at(1), at(3)),
        ("GPU-2", at(3), None),
    ]
    # [start, end) overlap: an interval ending at the window's start is not in it.
    assert rows(db, served(customer_id=acme_id, start=at(3), end=at(4))) == [("GPU-2", at(3), None)]
    assert rows(db, served(customer_id=acme_id, start=at(2), end=at(3))) == [
        ("GPU-1", at(1), at(3))
    ]
    assert rows(db, served(customer_id=acme_id, gpu_uuids=["GPU-3"])) == []
    assert rows(db, served(rental_ids=[uuid.UUID(theirs["id"])])) == [("GPU-3", at(1), None)]
