"""Names are one line of visible text: control characters and invisible format characters (a
bidi override that makes a name read otherwise, a zero-width space that makes two names that
look alike differ) are refused with a 422 naming the field, wherever a name is given."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.harness import Console

# (path, body with the name as NAME, field) for every kind of name the API takes.
Body = Callable[[Console, str], tuple[str, str, dict[str, Any], list[str]]]


def customer(console: Console, name: str) -> tuple[str, str, dict[str, Any], list[str]]:
    return "POST", "/v1/customers", {"name": name}, ["body", "name"]


def renamed_customer(console: Console, name: str) -> tuple[str, str, dict[str, Any], list[str]]:
    path = f"/v1/customers/{console.customer('Acme AI')['id']}"
    return "PATCH", path, {"name": name}, ["body", "name"]


def plan(console: Console, name: str) -> tuple[str, str, dict[str, Any], list[str]]:
    prices = [
        {"gpu_model": "H100", "price_per_hour": "2.49", "effective_from": "2026-01-01T00:00:00Z"}
    ]
    return "POST", "/v1/plans", {"name": name, "prices": prices}, ["body", "name"]


def customer_key(console: Console, name: str) -> tuple[str, str, dict[str, Any], list[str]]:
    path = f"/v1/customers/{console.customer('Beta Labs')['id']}/keys"
    return "POST", path, {"name": name}, ["body", "name"]


def admin_key(console: Console, name: str) -> tuple[str, str, dict[str, Any], list[str]]:
    return "POST", "/v1/keys", {"name": name}, ["body", "name"]


def rental(console: Console, name: str) -> tuple[str, str, dict[str, Any], list[str]]:
    body = console.rental_body(console.customer("Gamma")["id"], console.plan()["id"], name=name)
    return "POST", "/v1/rentals", body, ["body", "name"]


def node(console: Console, name: str) -> tuple[str, str, dict[str, Any], list[str]]:
    return "POST", "/v1/nodes", {"hostname": name, "datacenter": "fra1"}, ["body", "hostname"]


def datacenter(console: Console, name: str) -> tuple[str, str, dict[str, Any], list[str]]:
    return "POST", "/v1/nodes", {"hostname": "n-7", "datacenter": name}, ["body", "datacenter"]


NAMES = [customer, renamed_customer, plan, customer_key, admin_key, rental, node, datacenter]


@pytest.mark.parametrize("where", NAMES, ids=lambda f: f.__name__)
@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("Acme\u202eIA", "U+202E (RIGHT-TO-LEFT OVERRIDE) at position 5"),
        ("Ac\u200bme", "U+200B (ZERO WIDTH SPACE) at position 3"),
        ("\ufeffAcme", "U+FEFF (ZERO WIDTH NO-BREAK SPACE) at position 1"),
        ("Acme\u2066", "U+2066 (LEFT-TO-RIGHT ISOLATE) at position 5"),
        ("Ac\u200dme", "U+200D (ZERO WIDTH JOINER) at position 3"),  # between ASCII letters
        ("Acme\u2028AI", "U+2028 (LINE SEPARATOR) at position 5"),
        ("Acme\x1bAI", "U+001B (ESC) at position 5"),
    ],
)
def test_a_name_with_a_hidden_character_is_422_naming_the_field(
    console: Console, where: Body, name: str, message: str
) -> None:
    method, path, body, loc = where(console, name)
    response = console.client.request(method, path, json=body, headers=console.headers)
    assert response.status_code == 422, response.text
    [error] = response.json()["detail"]
    assert error["loc"] == loc
    assert message in error["msg"]
    assert "control or invisible format character" in error["msg"]


@pytest.mark.parametrize(
    "name",
    # Persian with its zero-width non-joiner, an emoji ZWJ sequence, accents, CJK
    [
        "\u067e\u0698\u0648\u0647\u0634\u200c\u06af\u0627\u0647",
        "team 👩\u200d💻",
        "Ünïcödé GmbH",
        "算力 研究所",
    ],
)
def test_names_in_any_script_are_kept_as_given(console: Console, name: str) -> None:
    assert console.customer(name)["name"] == name
    assert (
        console.post("/v1/nodes", {"hostname": name, "datacenter": "fra1"})["node"]["hostname"]
        == name
    )
