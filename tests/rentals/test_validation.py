"""Bad input gets a 4xx that says what is wrong and where; nothing accepted is lost."""

from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.harness import Console


def only_error(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    [error] = response.json()["detail"]
    return error


@pytest.fixture
def setup(console: Console) -> dict[str, Any]:
    customer = console.customer()
    plan = console.plan()
    node = console.node()["node"]
    gpus = [console.gpu(node["id"], f"GPU-{i}") for i in range(3)]
    return {"customer": customer, "plan": plan, "node": node, "gpus": gpus}


def test_rental_ending_before_it_starts_is_422(console: Console, setup: dict[str, Any]) -> None:
    body = Console.rental_body(
        setup["customer"]["id"],
        setup["plan"]["id"],
        start_at="2026-11-02T00:00:00Z",
        end_at="2026-11-01T00:00:00Z",
    )
    error = only_error(console.client.post("/v1/rentals", json=body, headers=console.headers), 422)
    assert error["loc"] == ["body"]
    assert (
        "end_at 2026-11-01T00:00:00+00:00 must be after 2026-11-02T00:00:00+00:00" in error["msg"]
    )


def test_assignment_ending_before_it_starts_is_422(console: Console, setup: dict[str, Any]) -> None:
    rental = console.rental(setup["customer"]["id"], setup["plan"]["id"])
    error = only_error(
        console.client.post(
            f"/v1/rentals/{rental['id']}/assignments",
            json={
                "gpu_uuid": "GPU-0",
                "start_at": "2026-11-03T00:00:00Z",
                "end_at": "2026-11-02T00:00:00Z",
            },
            headers=console.headers,
        ),
        422,
    )
    assert "must be after" in error["msg"]


def test_overlapping_assignment_is_409_naming_the_other_rental(
    console: Console, setup: dict[str, Any]
) -> None:
    first = console.rental(setup["customer"]["id"], setup["plan"]["id"])
    second = console.rental(setup["customer"]["id"], setup["plan"]["id"])
    console.assign(first["id"], "GPU-0", "2026-11-01T00:00:00Z", end_at="2026-11-10T00:00:00Z")
    response = console.client.post(
        f"/v1/rentals/{second['id']}/assignments",
        json={"gpu_uuid": "GPU-0", "start_at": "2026-11-09T00:00:00Z"},
        headers=console.headers,
    )
    error = only_error(response, 409)
    assert error["loc"] == ["body", "gpu_uuid"]
    assert error["conflicting_rental_id"] == first["id"]
    assert f"assigned to rental {first['id']}" in error["msg"]
    # Back-to-back is not an overlap: [start, end) intervals.
    console.assign(second["id"], "GPU-0", "2026-11-10T00:00:00Z")


def test_database_trigger_refuses_overlap_even_past_the_service(
    console: Console, setup: dict[str, Any], db: Any
) -> None:
    from sqlalchemy import text
    from sqlalchemy.exc import IntegrityError

    first = console.rental(setup["customer"]["id"], setup["plan"]["id"])
    second = console.rental(setup["customer"]["id"], setup["plan"]["id"])
    console.assign(first["id"], "GPU-1", "2026-11-01T00:00:00Z")
    with pytest.raises(IntegrityError, match="already assigned to rental"), db.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO gpu_assignments (rental_id, customer_id, gpu_uuid, start_at) "
                "VALUES (:r, :c, 'GPU-1', '2026-11-05T00:00:00Z')"
            ),
            {"r": second["id"], "c": setup["customer"]["id"]},
        )


def test_unknown_ids_are_404(console: Console, setup: dict[str, Any]) -> None:
    missing = "00000000-0000-4000-8000-000000000000"
    assert only_error(console.client.get(f"/v1/customers/{missing}", headers=console.headers), 404)[
        "msg"
    ] == (f"customer {missing} not found")
    assert console.client.get(f"/v1/rentals/{missing}", headers=console.headers).status_code == 404
    assert console.client.get("/v1/gpus/GPU-nope", headers=console.headers).status_code == 404
    body = Console.rental_body(missing, setup["plan"]["id"])
    error = only_error(console.client.post("/v1/rentals", json=body, headers=console.headers), 404)
    assert error["loc"] == ["body", "customer_id"]
    rental = console.rental(setup["customer"]["id"], setup["plan"]["id"])
    error = only_error(
        console.client.post(
            f"/v1/rentals/{rental['id']}/assignments",
            json={"gpu_uuid": "GPU-unknown", "start_at": "2026-11-01T00:00:00Z"},
            headers=console.headers,
        ),
        404,
    )
    assert error["loc"] == ["body", "gpu_uuid"]


@pytest.mark.parametrize(
    ("price", "fragment"),
    [("-0.01", "greater than or equal to 0"), ("1.12345678901", "no more than 10 decimal places")],
)
def test_negative_or_over_precise_prices_are_422(
    console: Console, price: str, fragment: str
) -> None:
    body = {
        "name": "bad",
        "prices": [
            {"gpu_model": "H100", "price_per_hour": price, "effective_from": "2026-01-01T00:00:00Z"}
        ],
    }
    error = only_error(console.client.post("/v1/plans", json=body, headers=console.headers), 422)
    assert error["loc"] == ["body", "prices", 0, "price_per_hour"]
    assert fragment in error["msg"]


def test_ten_decimal_places_are_kept_exactly(console: Console) -> None:
    plan = console.plan(price="2.4912345678")
    assert plan["prices"][0]["price_per_hour"] == "2.4912345678"


def test_assigning_a_gpu_in_maintenance_is_409(console: Console, setup: dict[str, Any]) -> None:
    rental = console.rental(setup["customer"]["id"], setup["plan"]["id"])
    response = console.client.patch(
        "/v1/gpus/GPU-2", json={"pool": "maintenance", "reason": "fan"}, headers=console.headers
    )
    assert response.json()["pool"] == "maintenance"
    response = console.client.post(
        f"/v1/rentals/{rental['id']}/assignments",
        json={"gpu_uuid": "GPU-2", "start_at": "2026-11-01T00:00:00Z"},
        headers=console.headers,
    )
    error = only_error(response, 409)
    assert error["msg"] == "GPU GPU-2 is in maintenance and cannot be assigned"


def test_unknown_fields_and_bad_types_name_the_field(console: Console) -> None:
    response = console.client.post(
        "/v1/customers",
        json={"name": "x", "currency": "XYZ", "colour": "red"},
        headers=console.headers,
    )
    assert response.status_code == 422
    locs = {tuple(e["loc"]) for e in response.json()["detail"]}
    assert locs == {("body", "currency"), ("body", "colour")}


def test_unknown_timezone_is_422(console: Console) -> None:
    response = console.client.post(
        "/v1/customers",
        json={"name": "x", "billing_timezone": "Mars/Olympus"},
        headers=console.headers,
    )
    assert "unknown IANA time zone 'Mars/Olympus'" in only_error(response, 422)["msg"]


def test_a_rental_cannot_hold_more_gpus_than_it_rents(
    console: Console, setup: dict[str, Any]
) -> None:
    rental = console.rental(setup["customer"]["id"], setup["plan"]["id"], gpu_count=1)
    console.assign(rental["id"], "GPU-0", "2026-11-01T00:00:00Z")
    console.assign(rental["id"], "GPU-1", "2026-11-01T00:00:00Z", status=409)


def test_plan_without_a_price_for_the_model_is_422(console: Console, setup: dict[str, Any]) -> None:
    body = Console.rental_body(setup["customer"]["id"], setup["plan"]["id"], gpu_model="A100")
    error = only_error(console.client.post("/v1/rentals", json=body, headers=console.headers), 422)
    assert error["loc"] == ["body", "gpu_model"]


def test_naive_datetimes_are_refused(
    client: TestClient, console: Console, setup: dict[str, Any]
) -> None:
    body = Console.rental_body(
        setup["customer"]["id"], setup["plan"]["id"], start_at="2026-11-01T00:00:00"
    )
    error = only_error(client.post("/v1/rentals", json=body, headers=console.headers), 422)
    assert error["loc"] == ["body", "start_at"]
    assert "timezone" in error["msg"]
