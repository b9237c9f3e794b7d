"""A rental's name: given on create or by a rename (PATCH), by an admin or by the customer for
its own rentals only; checked with clear 422s; a rename is no billing change."""

from typing import Any

import pytest
from sqlalchemy import Engine, text

from tests.harness import Console, bearer


@pytest.fixture
def customer(console: Console) -> dict[str, Any]:
    return console.customer()


@pytest.fixture
def plan(console: Console) -> dict[str, Any]:
    return console.plan()


def customer_key(console: Console, customer_id: str) -> dict[str, str]:
    return bearer(console.post(f"/v1/customers/{customer_id}/keys", {"name": "k"})["key"])


def test_a_rental_is_created_unnamed_or_with_its_name_without_surrounding_spaces(
    console: Console, customer: dict[str, Any], plan: dict[str, Any]
) -> None:
    assert console.rental(customer["id"], plan["id"])["name"] is None
    named = console.rental(customer["id"], plan["id"], name="  llama-70b finetune ")
    assert named["name"] == "llama-70b finetune"
    read = console.client.get(f"/v1/rentals/{named['id']}", headers=console.headers).json()
    assert read["name"] == "llama-70b finetune"


def test_a_customer_renames_its_own_rental_and_clears_the_name_with_null(
    console: Console, customer: dict[str, Any], plan: dict[str, Any]
) -> None:
    rental = console.rental(customer["id"], plan["id"])
    headers = customer_key(console, customer["id"])
    path = f"/v1/rentals/{rental['id']}"
    renamed = console.client.patch(path, json={"name": "eval sweep"}, headers=headers)
    assert renamed.status_code == 200, renamed.text
    assert (renamed.json()["name"], renamed.json()["start_at"]) == (
        "eval sweep",
        "2026-11-01T00:00:00Z",
    )
    assert console.client.get(path, headers=console.headers).json()["name"] == "eval sweep"
    cleared = console.client.patch(path, json={"name": None}, headers=headers)
    assert (cleared.status_code, cleared.json()["name"]) == (200, None)


def test_a_customer_cannot_rename_another_customers_rental(
    console: Console, customer: dict[str, Any], plan: dict[str, Any]
) -> None:
    theirs = console.rental(console.customer("Other Co")["id"], plan["id"], name="theirs")
    response = console.client.patch(
        f"/v1/rentals/{theirs['id']}",
        json={"name": "mine now"},
        headers=customer_key(console, customer["id"]),
    )
    assert response.status_code == 404
    read = console.client.get(f"/v1/rentals/{theirs['id']}", headers=console.headers).json()
    assert read["name"] == "theirs"


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("x" * 101, "String should have at most 100 characters"),
        ("   ", "String should have at least 1 character"),
        ("first\nsecond", "must be one line of visible text: U+000A"),
        (42, "Input should be a valid string"),
    ],
)
def test_a_bad_name_is_422_naming_the_field(
    console: Console, customer: dict[str, Any], plan: dict[str, Any], name: Any, message: str
) -> None:
    rental = console.rental(customer["id"], plan["id"])
    for method, path, body in [
        ("PATCH", f"/v1/rentals/{rental['id']}", {"name": name}),
        ("POST", "/v1/rentals", console.rental_body(customer["id"], plan["id"], name=name)),
    ]:
        response = console.client.request(method, path, json=body, headers=console.headers)
        assert response.status_code == 422, (method, response.text)
        [error] = response.json()["detail"]
        assert error["loc"] == ["body", "name"]
        assert message in error["msg"]


def test_a_rename_needs_the_name_field(
    console: Console, customer: dict[str, Any], plan: dict[str, Any]
) -> None:
    rental = console.rental(customer["id"], plan["id"])
    response = console.client.patch(f"/v1/rentals/{rental['id']}", json={}, headers=console.headers)
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", "name"]


def test_a_rename_leaves_changed_at_so_no_billed_month_looks_changed(
    console: Console, customer: dict[str, Any], plan: dict[str, Any], db: Engine
) -> None:
    rental = console.rental(customer["id"], plan["id"])
    query = text("SELECT changed_at FROM rentals WHERE id = :id")
    with db.connect() as connection:
        before = connection.execute(query, {"id": rental["id"]}).scalar_one()
    response = console.client.patch(
        f"/v1/rentals/{rental['id']}", json={"name": "renamed"}, headers=console.headers
    )
    assert response.status_code == 200
    with db.connect() as connection:
        assert connection.execute(query, {"id": rental["id"]}).scalar_one() == before
