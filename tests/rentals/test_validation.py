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


# --- inputs schemathesis found answered with 500 -----------------------------------------


def test_a_list_offset_beyond_bigint_is_422(console: Console) -> None:
    response = console.client.get(
        "/v1/customers?offset=9223372036854775808", headers=console.headers
    )
    assert only_error(response, 422)["loc"] == ["query", "offset"]


@pytest.mark.parametrize("stripe_id", ["cus_123", ""])
def test_a_duplicate_or_empty_stripe_customer_id_is_refused(
    console: Console, stripe_id: str
) -> None:
    first = console.customer("A", stripe_customer_id="cus_123")
    second = console.customer("B")
    body = {"name": "C", "stripe_customer_id": stripe_id}
    created = console.client.post("/v1/customers", json=body, headers=console.headers)
    updated = console.client.patch(
        f"/v1/customers/{second['id']}",
        json={"stripe_customer_id": stripe_id},
        headers=console.headers,
    )
    status = 409 if stripe_id else 422
    for response in (created, updated):
        error = only_error(response, status)
        assert error["loc"] == ["body", "stripe_customer_id"]
    if stripe_id:
        assert first["id"] in error["msg"]
    # Setting one's own id again is no conflict.
    own = {"stripe_customer_id": "cus_123"}
    path = f"/v1/customers/{first['id']}"
    assert console.client.patch(path, json=own, headers=console.headers).status_code == 200


@pytest.mark.parametrize(
    ("kind", "field"),
    [("plans", "name"), ("plans", "increment_s"), ("customers", "name"), ("customers", "currency")],
)
def test_explicit_null_for_a_field_that_cannot_be_empty_is_422(
    console: Console, kind: str, field: str
) -> None:
    obj = console.plan() if kind == "plans" else console.customer()
    response = console.client.patch(
        f"/v1/{kind}/{obj['id']}", json={field: None}, headers=console.headers
    )
    assert only_error(response, 422)["loc"] == ["body", field]


def test_clearing_a_nullable_field_with_null_still_works(console: Console) -> None:
    customer = console.customer(email="ops@example.com")
    response = console.client.patch(
        f"/v1/customers/{customer['id']}", json={"email": None}, headers=console.headers
    )
    assert response.status_code == 200 and response.json()["email"] is None


@pytest.mark.parametrize("field", ["hostname", "datacenter"])
def test_a_nul_character_in_node_text_is_422(console: Console, field: str) -> None:
    body = {"hostname": "node-x", "datacenter": "fra1", field: "a\x00b"}
    response = console.client.post("/v1/nodes", json=body, headers=console.headers)
    error = only_error(response, 422)
    assert error["loc"] == ["body", field] and "NUL" in error["msg"]


@pytest.mark.parametrize("period", ["0000-01", "9999-12"])
@pytest.mark.parametrize("view", ["usage", "what-if"])
def test_a_period_outside_the_calendar_is_422(console: Console, period: str, view: str) -> None:
    customer = console.customer()
    response = console.client.get(
        f"/v1/customers/{customer['id']}/{view}?period={period}", headers=console.headers
    )
    assert only_error(response, 422)["loc"] == ["query", "period"]


def test_an_open_assignment_starting_after_the_rentals_end_is_422(
    console: Console, setup: dict[str, Any]
) -> None:
    rental = console.rental(
        setup["customer"]["id"], setup["plan"]["id"], end_at="2026-11-02T00:00:00Z"
    )
    error = console.assign(rental["id"], "GPU-0", "2026-11-03T00:00:00Z", status=422)
    assert error["detail"][0]["loc"] == ["body", "start_at"]


def test_a_node_with_the_longest_hostname_registers(console: Console) -> None:
    registered = console.post("/v1/nodes", {"hostname": "h" * 253, "datacenter": "fra1"})
    assert registered["node"]["hostname"] == "h" * 253
    assert registered["token"]["name"] == ("agent@" + "h" * 253)[:200]


def test_renaming_a_plan_to_another_plans_name_is_409(console: Console) -> None:
    taken = console.plan("reserved")
    plan = console.plan("on-demand")
    response = console.client.patch(
        f"/v1/plans/{plan['id']}", json={"name": "reserved"}, headers=console.headers
    )
    error = only_error(response, 409)
    assert error["loc"] == ["body", "name"] and taken["id"] in error["msg"]
    same = console.client.patch(
        f"/v1/plans/{plan['id']}", json={"name": "on-demand"}, headers=console.headers
    )
    assert same.status_code == 200
