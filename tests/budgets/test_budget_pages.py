"""Budgets from the dashboard: seen, created, changed and deleted by a signed-in browser's
forms (same-origin only), with thresholds, basis and hard limit, and the API agreeing."""

from __future__ import annotations

import re
from typing import Any

from fastapi.testclient import TestClient

from tests.dashboard.test_pages import portal_link, sign_in_with_link
from tests.dashboard.world import World
from tests.harness import Console, bearer

OWN = {"Origin": "https://testserver"}


def budgets(client: TestClient, key: str, customer_id: str) -> list[dict[str, Any]]:
    path = f"/v1/customers/{customer_id}/budgets/status"
    return list(client.get(path, headers=bearer(key)).json()["items"])


def test_a_customer_creates_changes_and_deletes_a_budget_from_the_dashboard(
    client: TestClient, console: Console, seeded: World, october: None
) -> None:
    acme, other = seeded.acme, seeded.other
    sign_in_with_link(client, portal_link(console, acme.customer["id"]))
    page = client.get("/dashboard/budgets")
    assert page.status_code == 200 and "No budgets yet" in page.text
    assert "The forecast assumes the cost so far" in page.text

    form = {"amount": "100", "actual": "50, 80", "forecast": "100", "hard_limit": "on"}
    created = client.post("/dashboard/budgets", data=form, headers=OWN, follow_redirects=False)
    assert (created.status_code, created.headers["location"]) == (303, "/dashboard/budgets")
    [status] = budgets(client, acme.key, acme.customer["id"])
    budget = status["budget"]
    assert isinstance(budget, dict)
    assert (budget["amount"], budget["hard_limit"], budget["rental_id"]) == ("100.00", True, None)
    assert [(t["basis"], t["percent"]) for t in budget["thresholds"]] == [
        ("actual", 50),
        ("actual", 80),
        ("forecast", 100),
    ]
    listed = client.get("/dashboard/budgets").text
    row = re.search(rf'<tr data-budget="{budget["id"]}".*?</tr>', listed, re.S)
    assert row is not None
    assert f'data-raw="{status["spend"]}"' in row.group(0)
    assert f'data-raw="{status["forecast"]}"' in row.group(0)
    assert "50 % of actual" in row.group(0) and "100 % of forecast" in row.group(0)

    # Changed: a bad percent is refused with the field named, nothing saved; then a good one.
    edit = f"/dashboard/budgets/{budget['id']}"
    assert client.get(edit).status_code == 200
    bad = client.post(edit, data={**form, "actual": "50, lots"}, headers=OWN)
    assert bad.status_code == 422 and "&#39;lots&#39; is not a whole percent" in bad.text
    changed = {"amount": "250.5", "actual": "90", "forecast": ""}
    saved = client.post(edit, data=changed, headers=OWN, follow_redirects=False)
    assert saved.status_code == 303
    [status] = budgets(client, acme.key, acme.customer["id"])
    budget = status["budget"]
    assert isinstance(budget, dict)
    assert (budget["amount"], budget["hard_limit"]) == ("250.50", False)
    assert [(t["basis"], t["percent"]) for t in budget["thresholds"]] == [("actual", 90)]

    # Another customer's budget is not this session's to see, change or delete.
    theirs = client.post(
        f"/v1/customers/{other.customer['id']}/budgets",
        json={"amount": "5"},
        headers=bearer(other.key),
    ).json()
    for path in (f"/dashboard/budgets/{theirs['id']}", f"/dashboard/budgets/{theirs['id']}/delete"):
        assert client.post(path, data=changed, headers=OWN).status_code == 404
    assert budgets(client, other.key, other.customer["id"])[0]["budget"]["amount"] == "5.00"

    # A form on another site cannot use the session; the customer's own delete works.
    delete = f"{edit}/delete"
    assert client.post(delete, headers={"Origin": "https://evil.example"}).status_code == 403
    assert len(budgets(client, acme.key, acme.customer["id"])) == 1
    gone = client.post(delete, headers=OWN, follow_redirects=False)
    assert gone.status_code == 303 and budgets(client, acme.key, acme.customer["id"]) == []


def test_a_signed_out_form_changes_nothing_and_a_rental_budget_is_offered(
    client: TestClient, console: Console, seeded: World, october: None
) -> None:
    acme = seeded.acme
    refused = client.post(
        "/dashboard/budgets", data={"amount": "100"}, headers=OWN, follow_redirects=False
    )
    assert refused.status_code == 303
    assert refused.headers["location"].startswith("/dashboard/sign-in")
    assert budgets(client, acme.key, acme.customer["id"]) == []
    sign_in_with_link(client, portal_link(console, acme.customer["id"]))
    rental = acme.rental["id"]
    assert f'<option value="{rental}"' in client.get("/dashboard/budgets").text
    form = {"amount": "40", "rental": rental, "actual": "100"}
    assert client.post("/dashboard/budgets", data=form, headers=OWN).status_code == 200
    [status] = budgets(client, acme.key, acme.customer["id"])
    assert status["budget"]["rental_id"] == rental


def test_budgets_change_through_the_api_too(client: TestClient, seeded: World) -> None:
    acme, other = seeded.acme, seeded.other
    base = f"/v1/customers/{acme.customer['id']}/budgets"
    budget = client.post(base, json={"amount": "100"}, headers=bearer(acme.key)).json()
    path = f"/v1/budgets/{budget['id']}"
    body = {"thresholds": [{"percent": 75, "basis": "forecast"}], "hard_limit": True}
    changed = client.patch(path, json=body, headers=bearer(acme.key))
    assert changed.status_code == 200, changed.text
    assert (changed.json()["amount"], changed.json()["hard_limit"]) == ("100.00", True)
    assert changed.json()["thresholds"] == [{"percent": 75, "basis": "forecast"}]
    assert client.patch(path, json={"amount": "0"}, headers=bearer(acme.key)).status_code == 422
    assert client.patch(path, json={"amount": "9"}, headers=bearer(other.key)).status_code == 404
