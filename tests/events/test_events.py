"""Domain events: written with the change they describe, read back by cursor."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from fastapi import FastAPI
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

from app.billing.endpoints import clock
from app.core.db import transaction
from app.events import service
from app.events.models import DomainEvent
from app.payments.models import StripeOutbox
from tests.billing.world import october_with_failure
from tests.harness import Console, bearer
from tests.metering.conftest import Agent, event, minute_ago, rec

NOW = datetime(2026, 11, 5, 12, 0, tzinfo=UTC)


def events(console: Console, query: str = "", key: str | None = None) -> dict[str, Any]:
    headers = bearer(key) if key else console.headers
    response = console.client.get(f"/v1/events{query}", headers=headers)
    assert response.status_code == 200, response.text
    return response.json()


def types(page: dict[str, Any]) -> list[str]:
    return [item["type"] for item in page["items"]]


@pytest.fixture
def october(app: FastAPI, console: Console, db: Engine) -> dict[str, Any]:
    """October's world (a migration), its invoice drafted; the API's clock after its grace."""
    app.dependency_overrides[clock] = lambda: NOW
    world = october_with_failure(console, db)
    [invoice_id] = console.post("/v1/invoices/runs", {"period": "2026-10"}, 200)["invoice_ids"]
    return {"customer": world.customer, "rental": world.rental, "invoice_id": invoice_id}


def test_invoice_lifecycle_and_migration_are_events_with_their_facts(
    console: Console, october: dict[str, Any]
) -> None:
    invoice_id = october["invoice_id"]
    final = console.post(f"/v1/invoices/{invoice_id}/finalize", {}, 200)
    console.post(f"/v1/invoices/{invoice_id}/void", {"reason": "wrong address"}, 200)

    page = events(console)
    assert types(page) == [
        "rental.migrated",
        "invoice.finalized",
        "voucher.issued",
        "invoice.voided",
    ]
    migrated, finalized, voucher, voided = page["items"]
    assert (voucher["data"]["source"], voucher["data"]["amount"]) == ("tier", "277.59")
    assert migrated["subject"] == f"rental/{october['rental']['id']}"
    assert migrated["customer_id"] == october["customer"]["id"]
    assert isinstance(migrated["data"].pop("migration_id"), int)
    assert migrated["data"] == {
        "rental_id": october["rental"]["id"],
        "from_gpu_uuid": "GPU-A",
        "to_gpu_uuid": "GPU-B",
        "failed_at": "2026-10-10T12:47:00+00:00",
        "resumed_at": "2026-10-10T12:47:30+00:00",
        "downtime_s": 30,
        "reason": "XID 79",
    }
    assert finalized["subject"] == f"invoice/{invoice_id}"
    assert finalized["version"] == 1
    assert finalized["data"] == {
        "invoice_id": invoice_id,
        "number": "GM-2026-000001",
        "period": "2026-10",
        "status": "finalized",
        "currency": "USD",
        "subtotal": final["subtotal"],
        "tax": final["tax"],
        "total": final["total"],
        "amount_due": final["amount_due"],
        "finalized_at": "2026-11-05T12:00:00+00:00",
    }
    assert isinstance(finalized["data"]["total"], str)  # money is never a float
    assert voided["data"]["status"] == "void"
    assert voided["data"]["reason"] == "wrong address"
    assert len({item["id"] for item in page["items"]}) == 4


def test_paid_is_an_event(console: Console, october: dict[str, Any]) -> None:
    invoice_id = october["invoice_id"]
    console.post(f"/v1/invoices/{invoice_id}/finalize", {}, 200)
    console.post(f"/v1/invoices/{invoice_id}/paid", {"paid_at": "2026-11-06T09:00:00Z"}, 200)
    [paid] = events(console, "?type=invoice.paid")["items"]
    assert (paid["data"]["status"], paid["data"]["paid_at"]) == (
        "paid",
        "2026-11-06T09:00:00+00:00",
    )


def test_gpu_state_changes_carry_their_evidence(console: Console) -> None:
    registered = console.node("node-1")
    agent = Agent(console.client, registered["node"]["id"], registered["token"]["key"])
    t = minute_ago(5)
    agent.post([rec("GPU-1", t, t + 30)])  # first seen healthy: no change
    change = event("GPU-1", t + 30, "state_change", state="failed", rule="xid_79_fallen_off_bus")
    xid = event("GPU-1", t + 30, code=79)
    agent.post([rec("GPU-1", t + 30, t + 60, "failed")], [xid, change])
    agent.post([rec("GPU-1", t + 60, t + 90, "failed")])  # still failed: no change
    agent.post([rec("GPU-1", t + 90, t + 120, "degraded")])
    agent.post([rec("GPU-1", t + 120, t + 150, "healthy")])

    page = events(console, "?type=gpu.state_changed")
    changes = [(i["data"]["change"], i["data"]["from_state"]) for i in page["items"]]
    assert changes == [("failed", "healthy"), ("degraded", "failed"), ("recovered", "degraded")]
    failed = page["items"][0]
    assert (failed["subject"], failed["customer_id"]) == ("gpu/GPU-1", None)
    assert failed["data"]["seen_at"] == datetime.fromtimestamp(t + 60, UTC).isoformat()
    assert [(e["kind"], e["code"], e["rule"]) for e in failed["data"]["evidence"]] == [
        ("xid", 79, None),
        ("state_change", None, "xid_79_fallen_off_bus"),
    ]


def publish_many(db: Engine, count: int, **fields: Any) -> None:
    with transaction(db) as session:
        for n in range(count):
            service.publish(session, "test.happened", {"n": n}, subject=f"thing/{n}", **fields)


def test_cursor_pages_through_every_event_once(console: Console, db: Engine) -> None:
    publish_many(db, 5)
    seen, cursor, pages = [], "", 0
    while True:
        page = events(console, f"?limit=2&after={cursor}")
        seen += [item["data"]["n"] for item in page["items"]]
        cursor, pages = page["next_cursor"], pages + 1
        if not page["has_more"]:
            break
    assert (seen, pages) == ([0, 1, 2, 3, 4], 3)
    publish_many(db, 1)  # a poller that kept the cursor sees only what is new
    assert [i["data"]["n"] for i in events(console, f"?after={cursor}")["items"]] == [0]
    assert events(console, f"?after={cursor}&limit=1")["has_more"] is False


def test_filters_by_type_and_time(console: Console, db: Engine) -> None:
    publish_many(db, 2)
    with transaction(db) as session:
        service.publish(session, "other.happened", {}, subject="x/1")
        [middle] = session.scalars(select(DomainEvent.occurred_at).order_by(DomainEvent.seq)).all()[
            1:2
        ]
    assert types(events(console, "?type=other.happened&type=test.happened")) == [
        "test.happened",
        "test.happened",
        "other.happened",
    ]
    stamp = middle.isoformat().replace("+00:00", "Z")
    assert [i["data"].get("n") for i in events(console, f"?since={stamp}")["items"]] == [1, None]
    assert [i["data"].get("n") for i in events(console, f"?until={stamp}")["items"]] == [0]


def test_customers_see_only_their_own_events(console: Console, db: Engine) -> None:
    acme, other = console.customer("Acme"), console.customer("Other")
    key = console.post(f"/v1/customers/{acme['id']}/keys", {"name": "acme"})["key"]
    publish_many(db, 1, customer_id=acme["id"])
    publish_many(db, 1, customer_id=other["id"])
    publish_many(db, 1)  # an operator's event (no customer)
    assert [i["customer_id"] for i in events(console, key=key)["items"]] == [acme["id"]]
    assert len(events(console)["items"]) == 3


@pytest.mark.parametrize(
    ("query", "loc"),
    [
        ("?after=abc", ["query", "after"]),
        ("?after=99999999999999999999", ["query", "after"]),  # past a BIGINT: was a 500
        ("?after=9223372036854775808", ["query", "after"]),
        ("?limit=0", ["query", "limit"]),
        ("?since=2026-11-01T00:00:00", ["query", "since"]),  # no offset
        ("?since=2026-11-02T00:00:00Z&until=2026-11-01T00:00:00Z", ["query", "since"]),
    ],
)
def test_bad_queries_say_what_is_wrong(console: Console, query: str, loc: list[str]) -> None:
    response = console.client.get(f"/v1/events{query}", headers=console.headers)
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == loc


def test_event_and_subscribers_roll_back_with_the_change(db: Engine) -> None:
    def echo(session: Session, published: DomainEvent) -> None:
        service.publish(session, "test.echoed", {"of": published.id}, subject=published.subject)

    service.subscribe("test.happened", echo)
    try:
        with pytest.raises(RuntimeError), transaction(db) as session:
            service.publish(session, "test.happened", {}, subject="thing/1")
            raise RuntimeError("the change fails after publishing")
        publish_many(db, 1)
    finally:
        service.unsubscribe("test.happened", echo)
    with transaction(db) as session:
        stored = session.execute(select(DomainEvent.type, DomainEvent.data)).all()
        first = session.scalars(select(DomainEvent.id).where(DomainEvent.seq == 1)).first()
    assert first is None  # the rolled-back transaction's event is gone, with its echo
    assert [row.type for row in stored] == ["test.happened", "test.echoed"]
    assert stored[1].data["of"] != ""


def test_finalizing_queues_the_stripe_mirror_through_the_event(
    console: Console, october: dict[str, Any], db: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.settings import get_settings

    monkeypatch.setenv("GPUMETER_STRIPE_API_KEY", "sk_test_x")
    get_settings.cache_clear()
    try:
        console.post(f"/v1/invoices/{october['invoice_id']}/finalize", {}, 200)
    finally:
        get_settings.cache_clear()
    with transaction(db) as session:
        assert session.scalar(select(func.count()).select_from(StripeOutbox)) == 1


def test_an_event_type_must_look_like_one(db: Engine) -> None:
    with pytest.raises(ValueError, match="is not like"), transaction(db) as session:
        service.publish(session, "InvoiceFinalized", {}, subject="invoice/1")
