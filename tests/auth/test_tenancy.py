"""Tenancy: a customer key sees nothing of another customer, on every route of the app.

Every (method, path) the app serves must have an entry in ROUTES; a new route without one
fails `test_every_route_has_a_tenancy_case`. Each entry says what customer B's key gets for
customer A's objects:
- HIDDEN: 404 (existence never revealed), while A's own key gets 200;
- SCOPED: 200, with none of A's identifiers in the body, while A's key sees A's data;
- ADMIN_ONLY / NODE_ONLY: 403 for any customer key;
- PUBLIC: no authentication, no customer data.
- SIGNED: authenticated by a signature (Stripe's webhook), not by keys: an API key alone
  gets 400, and no customer data.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from enum import Enum
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from app.billing.models import CreditNote
from app.core.db import transaction
from app.failover import service as failover_service
from app.settings import get_settings
from tests.harness import Console, bearer

pytestmark = pytest.mark.xdist_group("tenancy")  # one world for the module: see ``module_db``


class Expect(Enum):
    HIDDEN = "hidden"
    SCOPED = "scoped"
    ADMIN_ONLY = "admin_only"
    NODE_ONLY = "node_only"
    PUBLIC = "public"
    SIGNED = "signed"


@dataclass(frozen=True)
class Case:
    expect: Expect
    query: str = ""  # appended to the path; may name A's objects to try to widen the scope
    body: dict[str, Any] = field(default_factory=dict)


ROUTES: dict[tuple[str, str], Case] = {
    ("GET", "/healthz"): Case(Expect.PUBLIC),
    ("GET", "/readyz"): Case(Expect.PUBLIC),
    ("GET", "/metrics"): Case(Expect.ADMIN_ONLY),
    ("POST", "/v1/keys"): Case(Expect.ADMIN_ONLY, body={"name": "x"}),
    ("GET", "/v1/keys"): Case(Expect.ADMIN_ONLY),
    ("POST", "/v1/keys/{key_id}/revoke"): Case(Expect.ADMIN_ONLY),
    ("POST", "/v1/keys/scheduler"): Case(Expect.ADMIN_ONLY, body={"name": "x"}),
    ("POST", "/v1/customers"): Case(Expect.ADMIN_ONLY, body={"name": "x"}),
    ("GET", "/v1/customers"): Case(Expect.SCOPED),
    ("GET", "/v1/customers/{customer_id}"): Case(Expect.HIDDEN),
    ("PATCH", "/v1/customers/{customer_id}"): Case(Expect.ADMIN_ONLY, body={"name": "x"}),
    ("POST", "/v1/customers/{customer_id}/keys"): Case(Expect.ADMIN_ONLY, body={"name": "x"}),
    ("GET", "/v1/customers/{customer_id}/keys"): Case(Expect.HIDDEN),
    ("POST", "/v1/nodes"): Case(Expect.ADMIN_ONLY),
    ("GET", "/v1/nodes"): Case(Expect.ADMIN_ONLY),
    ("GET", "/v1/nodes/{node_id}"): Case(Expect.ADMIN_ONLY),
    ("POST", "/v1/nodes/{node_id}/token"): Case(Expect.ADMIN_ONLY),
    ("GET", "/v1/nodes/{node_id}/gpus"): Case(Expect.ADMIN_ONLY),
    ("GET", "/v1/gpus"): Case(Expect.SCOPED, query="?node_id={node_id}"),
    ("POST", "/v1/gpus"): Case(Expect.ADMIN_ONLY),
    ("GET", "/v1/gpus/{gpu_uuid}"): Case(Expect.HIDDEN),
    ("GET", "/v1/gpus/{gpu_uuid}/claims"): Case(Expect.ADMIN_ONLY),
    ("POST", "/v1/gpus/{gpu_uuid}/settle"): Case(Expect.ADMIN_ONLY, body={"node_id": None}),
    ("PATCH", "/v1/gpus/{gpu_uuid}"): Case(Expect.ADMIN_ONLY, body={"pool": "spare"}),
    ("POST", "/v1/gpus/{gpu_uuid}/maintenance"): Case(
        Expect.ADMIN_ONLY,
        body={"start_at": "2026-10-01T00:00:00Z", "end_at": "2026-10-01T01:00:00Z"},
    ),
    ("POST", "/v1/plans"): Case(Expect.ADMIN_ONLY),
    ("GET", "/v1/plans"): Case(Expect.SCOPED),
    # Both customers rent on the shared plan: B sees it, but never A's contract price.
    ("GET", "/v1/plans/{plan_id}"): Case(Expect.SCOPED),
    ("PATCH", "/v1/plans/{plan_id}"): Case(Expect.ADMIN_ONLY),
    ("POST", "/v1/plans/{plan_id}/prices"): Case(Expect.ADMIN_ONLY),
    ("GET", "/v1/plans/{plan_id}/prices"): Case(Expect.SCOPED),
    ("POST", "/v1/rentals"): Case(Expect.ADMIN_ONLY),
    ("GET", "/v1/rentals"): Case(Expect.SCOPED, query="?customer_id={customer_id}"),
    ("GET", "/v1/rentals/{rental_id}"): Case(Expect.HIDDEN),
    ("PATCH", "/v1/rentals/{rental_id}"): Case(Expect.HIDDEN, body={"name": "x"}),
    ("POST", "/v1/rentals/{rental_id}/end"): Case(Expect.ADMIN_ONLY),
    ("POST", "/v1/rentals/{rental_id}/assignments"): Case(Expect.ADMIN_ONLY),
    ("POST", "/v1/rentals/{rental_id}/assignments/{assignment_id}/end"): Case(Expect.ADMIN_ONLY),
    ("POST", "/v1/rentals/{rental_id}/migrations"): Case(Expect.ADMIN_ONLY),
    ("GET", "/v1/rentals/{rental_id}/migrations"): Case(Expect.HIDDEN),
    ("POST", "/v1/ingest"): Case(Expect.NODE_ONLY, body={"batch_id": "b-1"}),
    ("GET", "/v1/gpus/{gpu_uuid}/timeline"): Case(
        Expect.HIDDEN, query="?start=2026-11-01T00:00:00Z&end=2026-11-02T00:00:00Z"
    ),
    ("GET", "/v1/gpus/{gpu_uuid}/metrics"): Case(
        Expect.HIDDEN, query="?start=2026-11-01T00:00:00Z&end=2026-11-02T00:00:00Z&step=3600"
    ),
    ("GET", "/v1/fleet/health"): Case(Expect.ADMIN_ONLY),
    ("GET", "/v1/events"): Case(Expect.SCOPED),
    ("POST", "/v1/customers/{customer_id}/portal-links"): Case(Expect.ADMIN_ONLY),
    ("POST", "/v1/customers/{customer_id}/portal-links/revoke"): Case(Expect.ADMIN_ONLY),
    ("POST", "/v1/invoices/runs"): Case(Expect.ADMIN_ONLY, body={"period": "2026-11"}),
    ("GET", "/v1/invoices"): Case(Expect.SCOPED, query="?customer_id={customer_id}"),
    ("GET", "/v1/invoices/{invoice_id}"): Case(Expect.HIDDEN),
    ("GET", "/v1/invoices/{invoice_id}/html"): Case(Expect.HIDDEN),
    ("GET", "/v1/invoices/{invoice_id}/credit-notes"): Case(Expect.HIDDEN),
    ("GET", "/v1/invoices/{invoice_id}/amount-due"): Case(Expect.HIDDEN),
    ("GET", "/v1/customers/{customer_id}/amount-due"): Case(Expect.HIDDEN, query="?period=2026-11"),
    ("GET", "/v1/customers/{customer_id}/credit-notes"): Case(Expect.HIDDEN),
    ("POST", "/v1/invoices/{invoice_id}/finalize"): Case(Expect.ADMIN_ONLY),
    ("POST", "/v1/invoices/{invoice_id}/void"): Case(Expect.ADMIN_ONLY, body={"reason": "x"}),
    ("POST", "/v1/invoices/{invoice_id}/paid"): Case(Expect.ADMIN_ONLY),
    ("GET", "/v1/customers/{customer_id}/usage"): Case(Expect.HIDDEN, query="?period=2026-11"),
    ("GET", "/v1/customers/{customer_id}/what-if"): Case(Expect.HIDDEN, query="?period=2026-11"),
    ("GET", "/v1/customers/{customer_id}/vouchers"): Case(Expect.HIDDEN),
    ("GET", "/v1/customers/{customer_id}/balance"): Case(Expect.HIDDEN),
    ("GET", "/v1/customers/{customer_id}/balance/entries"): Case(Expect.HIDDEN),
    ("POST", "/v1/customers/{customer_id}/balance/top-ups"): Case(
        Expect.ADMIN_ONLY, body={"amount": "1", "reason": "x"}
    ),
    ("POST", "/v1/customers/{customer_id}/vouchers"): Case(
        Expect.ADMIN_ONLY, body={"amount": "1", "reason": "x"}
    ),
    ("GET", "/v1/customers/{customer_id}/incidents"): Case(Expect.HIDDEN, query="?period=2026-11"),
    ("GET", "/v1/customers/{customer_id}/costs"): Case(Expect.HIDDEN, query="?period=2026-11"),
    ("GET", "/v1/customers/{customer_id}/exports/usage.csv"): Case(
        Expect.HIDDEN, query="?period=2026-11"
    ),
    ("GET", "/v1/customers/{customer_id}/exports/focus.csv"): Case(
        Expect.HIDDEN, query="?period=2026-11"
    ),
    ("POST", "/v1/customers/{customer_id}/budgets"): Case(Expect.HIDDEN, body={"amount": "5"}),
    ("GET", "/v1/customers/{customer_id}/budgets"): Case(Expect.HIDDEN),
    ("GET", "/v1/customers/{customer_id}/budgets/status"): Case(Expect.HIDDEN),
    ("PATCH", "/v1/budgets/{budget_id}"): Case(Expect.HIDDEN, body={"amount": "7"}),
    ("DELETE", "/v1/budgets/{budget_id}"): Case(Expect.HIDDEN),
    ("POST", "/v1/budget-checks"): Case(Expect.ADMIN_ONLY),
    ("GET", "/v1/fleet/summary"): Case(Expect.ADMIN_ONLY),
    ("GET", "/v1/revenue"): Case(Expect.ADMIN_ONLY),
    ("POST", "/v1/stripe/webhook"): Case(Expect.SIGNED, body={"id": "evt_x", "type": "x"}),
    ("GET", "/v1/stripe/sync"): Case(Expect.ADMIN_ONLY, query="?customer_id={customer_id}"),
    ("GET", "/v1/stripe/invoices/{invoice_id}"): Case(Expect.HIDDEN),
    ("POST", "/v1/stripe/invoices/{invoice_id}/retry"): Case(Expect.ADMIN_ONLY),
    ("POST", "/v1/webhooks/endpoints"): Case(Expect.ADMIN_ONLY, body={"url": "https://x.io"}),
    ("GET", "/v1/webhooks/endpoints"): Case(Expect.ADMIN_ONLY),
    ("GET", "/v1/webhooks/endpoints/{endpoint_id}"): Case(Expect.ADMIN_ONLY),
    ("PATCH", "/v1/webhooks/endpoints/{endpoint_id}"): Case(Expect.ADMIN_ONLY),
    ("POST", "/v1/webhooks/endpoints/{endpoint_id}/secret"): Case(Expect.ADMIN_ONLY),
    ("GET", "/v1/webhooks/endpoints/{endpoint_id}/deliveries"): Case(Expect.ADMIN_ONLY),
    ("POST", "/v1/webhooks/deliveries/{delivery_id}/resend"): Case(Expect.ADMIN_ONLY),
    ("GET", "/v1/scheduled-invoice-runs"): Case(Expect.ADMIN_ONLY),
    # failover (app.failover): the orchestrator's answers and the spare pool are operators'.
    ("GET", "/v1/failovers"): Case(Expect.SCOPED, query="?rental_id={rental_id}"),
    ("GET", "/v1/failovers/{failover_id}"): Case(Expect.HIDDEN),
    ("GET", "/v1/failovers/summary"): Case(Expect.ADMIN_ONLY),
    ("POST", "/v1/failovers/{failover_id}/resumed"): Case(Expect.ADMIN_ONLY),
    ("POST", "/v1/failovers/{failover_id}/abandoned"): Case(
        Expect.ADMIN_ONLY, body={"reason": "x"}
    ),
    ("GET", "/v1/spare-pool"): Case(Expect.ADMIN_ONLY),
    # Slurm (app.slurm): the adapter's API runs with an admin key.
    ("PUT", "/v1/slurm/accounts/{account}"): Case(
        Expect.ADMIN_ONLY, body={"customer_id": "{customer_id}", "plan_id": "{plan_id}"}
    ),
    ("GET", "/v1/slurm/accounts"): Case(Expect.ADMIN_ONLY),
    ("DELETE", "/v1/slurm/accounts/{account}"): Case(Expect.ADMIN_ONLY),
    ("POST", "/v1/slurm/snapshots"): Case(
        Expect.ADMIN_ONLY, body={"cluster": "hpc", "taken_at": 0, "jobs": []}
    ),
    ("GET", "/v1/slurm/jobs"): Case(Expect.ADMIN_ONLY),
    ("GET", "/v1/slurm/actions"): Case(Expect.ADMIN_ONLY, query="?cluster=hpc"),
    ("POST", "/v1/slurm/actions/{action_id}/done"): Case(Expect.ADMIN_ONLY, body={"outcome": "x"}),
    ("POST", "/v1/slurm/actions/{action_id}/resumed"): Case(Expect.ADMIN_ONLY),
    ("POST", "/v1/slurm/actions/{action_id}/abandoned"): Case(
        Expect.ADMIN_ONLY, body={"reason": "x"}
    ),
    ("GET", "/v1/slurm/layout"): Case(Expect.ADMIN_ONLY),
    ("POST", "/v1/slurm/nodes/{node}/resumed-by-hand"): Case(
        Expect.ADMIN_ONLY, body={"cluster": "hpc", "state": "IDLE"}
    ),
    ("GET", "/v1/spare-policies"): Case(Expect.ADMIN_ONLY),
    ("PUT", "/v1/spare-policies"): Case(
        Expect.ADMIN_ONLY, body={"datacenter": "fra1", "model": "H100", "target_percent": "5"}
    ),
}

A_CONTRACT_PRICE = "1.2345678901"


@dataclass
class World:
    """Customer A's objects (ids fill the route templates) and both customers' keys."""

    ids: dict[str, str]
    a_key: str
    b_key: str
    a_markers: list[str]  # strings that only A's data contains


def build_world(console: Console) -> World:
    a = console.customer("Customer A", email="a@example.com")
    b = console.customer("Customer B", email="b@example.com")
    shared_plan = console.plan("shared")
    console.post(
        f"/v1/plans/{shared_plan['id']}/prices",
        {
            "gpu_model": "H100",
            "price_per_hour": A_CONTRACT_PRICE,
            "effective_from": "2026-10-01T00:00:00Z",
            "customer_id": a["id"],
        },
    )
    node = console.node()["node"]
    console.gpu(node["id"], "GPU-A-1")
    console.gpu(node["id"], "GPU-A-2")
    console.gpu(node["id"], "GPU-B-1")
    a_rental = console.rental(a["id"], shared_plan["id"])
    b_rental = console.rental(b["id"], shared_plan["id"])
    assignment = console.assign(a_rental["id"], "GPU-A-1", "2026-11-01T00:00:00Z")
    console.assign(b_rental["id"], "GPU-B-1", "2026-11-01T00:00:00Z")
    console.post(
        f"/v1/rentals/{a_rental['id']}/migrations",
        {
            "from_gpu_uuid": "GPU-A-1",
            "to_gpu_uuid": "GPU-A-2",
            "failed_at": "2026-11-02T00:00:00Z",
            "resumed_at": "2026-11-02T00:00:30Z",
        },
    )
    invoice_run = {"period": "2026-11", "customer_id": a["id"]}
    [invoice_id] = console.post("/v1/invoices/runs", invoice_run, 200)["invoice_ids"]
    budget = console.post(f"/v1/customers/{a['id']}/budgets", {"amount": "100"})
    # A's own DELETE case deletes ``budget``; this one stays for the cases that read budgets.
    console.post(f"/v1/customers/{a['id']}/budgets", {"amount": "200"})
    console.post(f"/v1/customers/{a['id']}/balance/top-ups", {"amount": "5", "reason": "x"})
    a_key = console.post(f"/v1/customers/{a['id']}/keys", {"name": "a"})
    b_key = console.post(f"/v1/customers/{b['id']}/keys", {"name": "b"})
    ids = {
        "customer_id": a["id"],
        "node_id": node["id"],
        "gpu_uuid": "GPU-A-1",
        "plan_id": shared_plan["id"],
        "rental_id": a_rental["id"],
        "assignment_id": str(assignment["id"]),
        "key_id": a_key["id"],
        "invoice_id": invoice_id,
        "budget_id": budget["id"],
        "endpoint_id": str(uuid.uuid4()),  # admin-only routes: refused before any lookup
        "delivery_id": "1",
        "account": "acme-ml",  # Slurm routes are admin-only: refused before any lookup
        "action_id": "1",
        "node": "n1",
    }
    markers = [
        a["id"],
        a_rental["id"],
        "GPU-A-1",
        a_key["prefix"],
        A_CONTRACT_PRICE,
        "a@example.com",
        invoice_id,
    ]
    return World(ids=ids, a_key=a_key["key"], b_key=b_key["key"], a_markers=markers)


def app_routes(app: FastAPI) -> set[tuple[str, str]]:
    paths = app.openapi()["paths"]
    return {(method.upper(), path) for path, ops in paths.items() for method in ops}


def test_every_route_has_a_tenancy_case(module_console: Console) -> None:
    app = module_console.client.app
    assert isinstance(app, FastAPI)
    missing = app_routes(app) - set(ROUTES)
    assert not missing, f"routes without a tenancy case in ROUTES: {sorted(missing)}"
    stale = set(ROUTES) - app_routes(app)
    assert not stale, f"ROUTES names routes the app no longer has: {sorted(stale)}"


@pytest.fixture(scope="module")
def world(module_console: Console, module_db: Engine) -> World:
    """One world for every route's case (seeding it per case was 85 s of the unit step): B's
    calls are refused or change only B's own data, and A's only add or delete A's own."""
    world = build_world(module_console)
    _credit_note(module_db, world.ids)
    _failover(module_db, world.ids)
    return world


def _credit_note(db: Engine, ids: dict[str, str]) -> None:
    """A credit note of A's, on A's invoice, for the credit-note routes to hide from B."""
    invoice = uuid.UUID(ids["invoice_id"])
    with transaction(db) as session:
        session.add(
            CreditNote(
                customer_id=uuid.UUID(ids["customer_id"]),
                number="CN-2026-000001",
                invoice_id=invoice,
                issued_with_invoice_id=invoice,
                currency="USD",
                amount=Decimal("1.00"),
                tax_rate=Decimal("0"),
                tax=Decimal("0.00"),
                total=Decimal("1.00"),
                reason="tenancy",
                issued_at=datetime(2026, 12, 1, tzinfo=UTC),
            )
        )


def _failover(db: Engine, ids: dict[str, str]) -> None:
    """A failover of A's rental (its GPU after the migration fails; no spare), for the
    failover routes to hide from B."""
    failed_at = datetime(2026, 11, 3, tzinfo=UTC)
    with transaction(db) as session:
        config = failover_service.FailoverSettings.of(get_settings())
        failover = failover_service.open_failover(
            session, "GPU-A-2", failed_at, failed_at, [], config
        )
        assert failover is not None
        ids["failover_id"] = str(failover.id)


def call(client: TestClient, method: str, path: str, case: Case, key: str | None) -> Any:
    headers = bearer(key) if key else {}
    return client.request(
        method, path, headers=headers, json=case.body if method != "GET" else None
    )


def ghost_ids(ids: dict[str, str]) -> dict[str, str]:
    """Ids of the same shapes that name nothing at all."""
    return {
        name: "GPU-GHOST"
        if name == "gpu_uuid"
        else "987654321"
        if value.isdigit()
        else str(uuid.uuid4())
        for name, value in ids.items()
    }


# Deletions last: A's own DELETE removes the object other cases (a PATCH of it) read.
DELETIONS_LAST = [
    *sorted(route for route in ROUTES if route[0] != "DELETE"),
    *sorted(route for route in ROUTES if route[0] == "DELETE"),
]


@pytest.mark.parametrize(("method", "template"), DELETIONS_LAST)
def test_second_customer_sees_nothing_of_the_first(
    module_console: Console, world: World, method: str, template: str
) -> None:
    client = module_console.client
    case = ROUTES[(method, template)]
    path = (template + case.query).format(**world.ids)
    as_b = call(client, method, path, case, world.b_key)
    if case.expect == Expect.HIDDEN:
        # Indistinguishable from an object that does not exist, up to the id B itself sent.
        ghosts = ghost_ids(world.ids)
        as_ghost = call(client, method, (template + case.query).format(**ghosts), case, world.b_key)
        echoed = as_b.text
        for name, value in world.ids.items():
            echoed = re.sub(rf"\b{re.escape(value)}\b", ghosts[name], echoed)
        assert (as_b.status_code, echoed) == (as_ghost.status_code, as_ghost.text)
    else:
        leaked = [marker for marker in world.a_markers if marker in as_b.text]
        assert not leaked, f"{method} {path} showed customer B {leaked}: {as_b.text[:300]}"
    expected_b_status = {
        Expect.HIDDEN: 404,
        Expect.SCOPED: 200,
        Expect.ADMIN_ONLY: 403,
        Expect.NODE_ONLY: 403,
        Expect.PUBLIC: 200,
        Expect.SIGNED: 400,
    }[case.expect]
    assert as_b.status_code == expected_b_status, as_b.text
    if case.expect in (Expect.HIDDEN, Expect.SCOPED):
        # The same call with A's key finds A's data, so the case really exercised it.
        as_a = call(client, method, path, case, world.a_key)
        assert as_a.status_code in (200, 201), as_a.text  # 201: a customer creates its own
        assert any(marker in as_a.text for marker in world.a_markers), as_a.text[:300]
