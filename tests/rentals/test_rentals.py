from typing import Any

import pytest

from tests.harness import Console


@pytest.fixture
def rental(console: Console) -> dict[str, Any]:
    customer = console.customer()
    plan = console.plan()
    node = console.node()["node"]
    for uuid in ("GPU-A", "GPU-B"):
        console.gpu(node["id"], uuid)
    return console.rental(customer["id"], plan["id"])


def migration_body(**fields: str) -> dict[str, str]:
    """GPU-A failed at 10:00:00 and the rental resumed on GPU-B 30 s later, unless overridden."""
    return {
        "from_gpu_uuid": "GPU-A",
        "to_gpu_uuid": "GPU-B",
        "failed_at": "2026-11-03T10:00:00Z",
        "resumed_at": "2026-11-03T10:00:30Z",
        **fields,
    }


def test_migration_closes_the_failed_assignment_and_opens_one_on_the_new_gpu(
    console: Console, rental: dict[str, Any]
) -> None:
    console.assign(rental["id"], "GPU-A", "2026-11-01T00:00:00Z")
    migration = console.post(
        f"/v1/rentals/{rental['id']}/migrations", migration_body(reason="XID 79")
    )
    assert migration["failed_at"] == "2026-11-03T10:00:00Z"
    read = console.client.get(f"/v1/rentals/{rental['id']}", headers=console.headers).json()
    assert [(a["gpu_uuid"], a["start_at"], a["end_at"]) for a in read["assignments"]] == [
        ("GPU-A", "2026-11-01T00:00:00Z", "2026-11-03T10:00:00Z"),
        ("GPU-B", "2026-11-03T10:00:30Z", None),
    ]
    assert [m["id"] for m in read["migrations"]] == [migration["id"]]


def test_migration_from_a_gpu_the_rental_does_not_hold_is_409(
    console: Console, rental: dict[str, Any]
) -> None:
    response = console.client.post(
        f"/v1/rentals/{rental['id']}/migrations", json=migration_body(), headers=console.headers
    )
    assert response.status_code == 409
    assert response.json()["detail"][0]["loc"] == ["body", "from_gpu_uuid"]


def test_migration_resuming_before_failing_is_422(console: Console, rental: dict[str, Any]) -> None:
    response = console.client.post(
        f"/v1/rentals/{rental['id']}/migrations",
        json=migration_body(resumed_at="2026-11-03T09:00:00Z"),
        headers=console.headers,
    )
    assert response.status_code == 422
    assert "must not be before failed_at" in response.json()["detail"][0]["msg"]


def test_ending_a_rental_closes_its_open_assignments(
    console: Console, rental: dict[str, Any]
) -> None:
    console.assign(rental["id"], "GPU-A", "2026-11-01T00:00:00Z")
    ended = console.post(f"/v1/rentals/{rental['id']}/end", {"end_at": "2026-11-20T00:00:00Z"}, 200)
    assert ended["end_at"] == "2026-11-20T00:00:00Z"
    assert ended["assignments"][0]["end_at"] == "2026-11-20T00:00:00Z"
    again = console.client.post(
        f"/v1/rentals/{rental['id']}/end",
        json={"end_at": "2026-11-21T00:00:00Z"},
        headers=console.headers,
    )
    assert again.status_code == 409


def test_unassign_then_reassign_elsewhere(console: Console, rental: dict[str, Any]) -> None:
    assignment = console.assign(rental["id"], "GPU-A", "2026-11-01T00:00:00Z")
    ended = console.post(
        f"/v1/rentals/{rental['id']}/assignments/{assignment['id']}/end",
        {"end_at": "2026-11-02T00:00:00Z"},
        200,
    )
    assert ended["end_at"] == "2026-11-02T00:00:00Z"
    console.assign(rental["id"], "GPU-B", "2026-11-02T00:00:00Z")


def test_rentals_filter_by_activity_window(console: Console, rental: dict[str, Any]) -> None:
    console.post(f"/v1/rentals/{rental['id']}/end", {"end_at": "2026-11-05T00:00:00Z"}, 200)

    def listed(query: str) -> list[str]:
        response = console.client.get(f"/v1/rentals?{query}", headers=console.headers)
        return [r["id"] for r in response.json()["items"]]

    assert listed("active_from=2026-11-04T00:00:00Z") == [rental["id"]]
    assert listed("active_from=2026-11-05T00:00:00Z") == []
    assert listed("active_to=2026-11-01T00:00:00Z") == []


def test_pagination_walks_every_item_once(console: Console) -> None:
    ids = {console.customer(f"c{i}")["id"] for i in range(5)}
    seen: list[str] = []
    offset: int | None = 0
    while offset is not None:
        page = console.client.get(
            f"/v1/customers?limit=2&offset={offset}", headers=console.headers
        ).json()
        seen += [c["id"] for c in page["items"]]
        offset = page["next_offset"]
    assert sorted(seen) == sorted(ids)


def test_gpu_pool_changes_open_and_close_maintenance_windows(console: Console, db: Any) -> None:
    from sqlalchemy import select

    from app.core.db import transaction
    from app.fleet.models import MaintenanceWindow

    node = console.node()["node"]
    console.gpu(node["id"], "GPU-M")
    for pool in ("maintenance", "spare"):
        response = console.client.patch(
            "/v1/gpus/GPU-M", json={"pool": pool}, headers=console.headers
        )
        assert response.json()["pool"] == pool
    with transaction(db) as session:
        [window] = session.scalars(select(MaintenanceWindow)).all()
        assert window.end_at is not None and window.end_at >= window.start_at


def test_customer_contract_price_overrides_base_from_its_effective_time(
    console: Console, db: Any
) -> None:
    from datetime import UTC, datetime
    from decimal import Decimal

    from app.core.db import transaction
    from app.plans.service import price_schedule

    customer = console.customer()
    plan = console.plan(price="2.49")
    console.post(
        f"/v1/plans/{plan['id']}/prices",
        {
            "gpu_model": "H100",
            "price_per_hour": "1.99",
            "effective_from": "2026-06-01T00:00:00Z",
            "customer_id": customer["id"],
        },
    )
    console.post(
        f"/v1/plans/{plan['id']}/prices",
        {"gpu_model": "H100", "price_per_hour": "2.99", "effective_from": "2026-07-01T00:00:00Z"},
    )
    with transaction(db) as session:
        schedule = price_schedule(session, plan["id"], "H100", customer["id"])
    assert schedule == [  # (from, price, monthly cap per GPU: none here)
        (datetime(2026, 1, 1, tzinfo=UTC), Decimal("2.4900000000"), None),
        (datetime(2026, 6, 1, tzinfo=UTC), Decimal("1.9900000000"), None),
    ]


def test_migrations_and_prices_are_pages_with_limit(
    console: Console, rental: dict[str, Any]
) -> None:
    console.assign(rental["id"], "GPU-A", "2026-11-01T00:00:00Z")
    console.post(f"/v1/rentals/{rental['id']}/migrations", migration_body())
    console.post(
        f"/v1/rentals/{rental['id']}/migrations",
        migration_body(
            from_gpu_uuid="GPU-B",
            to_gpu_uuid="GPU-A",
            failed_at="2026-11-04T10:00:00Z",
            resumed_at="2026-11-04T10:00:30Z",
        ),
    )
    plan_id = rental["plan_id"]
    price = {
        "gpu_model": "A100",
        "price_per_hour": "1.10",
        "effective_from": "2026-10-01T00:00:00Z",
    }
    console.post(f"/v1/plans/{plan_id}/prices", price)
    for path in (f"/v1/rentals/{rental['id']}/migrations", f"/v1/plans/{plan_id}/prices"):
        first = console.client.get(f"{path}?limit=1", headers=console.headers).json()
        assert (len(first["items"]), first["limit"], first["next_offset"]) == (1, 1, 1), path
        rest = console.client.get(f"{path}?limit=1&offset=1", headers=console.headers).json()
        assert len(rest["items"]) == 1 and rest["next_offset"] is None, path
        assert rest["items"][0] != first["items"][0]
