"""The repositories' ``readable_*`` statements: an admin reads every customer's rows, a
customer key its own, and a node key (which has no customer) none at all."""

from __future__ import annotations

import uuid

from sqlalchemy import Engine, Select

from app.auth.models import KeyKind
from app.auth.service import Principal
from app.billing.reads import readable_invoices
from app.core.db import transaction
from app.events.models import DomainEvent
from app.events.repository import readable_events
from tests.harness import Console


def _customers_seen(engine: Engine, query: Select[DomainEvent]) -> set[uuid.UUID | None]:
    with transaction(engine) as session:
        return {row.customer_id for row in session.scalars(query)}


def _event(customer_id: uuid.UUID | None) -> DomainEvent:
    return DomainEvent(
        id=uuid.uuid4(),
        type="test.happened",
        subject="test/1",
        customer_id=customer_id,
        version=1,
        data={},
    )


def test_events_readable_by_admin_customer_and_node(db: Engine) -> None:
    a, b = uuid.uuid4(), uuid.uuid4()
    with transaction(db) as session:
        session.add_all([_event(a), _event(b), _event(None)])
    admin = Principal(uuid.uuid4(), KeyKind.ADMIN)
    customer_a = Principal(uuid.uuid4(), KeyKind.CUSTOMER, customer_id=a)
    node = Principal(uuid.uuid4(), KeyKind.NODE, node_id=uuid.uuid4())
    assert _customers_seen(db, readable_events(admin)) == {a, b, None}
    assert _customers_seen(db, readable_events(customer_a)) == {a}
    assert _customers_seen(db, readable_events(node)) == set()


def test_invoices_readable_by_admin_customer_and_node(console: Console, db: Engine) -> None:
    plan = console.plan("p")
    ids = []
    for name in ("A", "B"):
        customer = console.customer(name)
        console.rental(customer["id"], plan["id"])
        ids.append(uuid.UUID(customer["id"]))
    console.post("/v1/invoices/runs", {"period": "2026-11"}, 200)
    a, b = ids
    admin = Principal(uuid.uuid4(), KeyKind.ADMIN)
    customer_a = Principal(uuid.uuid4(), KeyKind.CUSTOMER, customer_id=a)
    node = Principal(uuid.uuid4(), KeyKind.NODE, node_id=uuid.uuid4())
    with transaction(db) as session:
        seen = {
            p: {i.customer_id for i in session.scalars(readable_invoices(p))}
            for p in (admin, customer_a, node)
        }
    assert seen == {admin: {a, b}, customer_a: {a}, node: set()}
