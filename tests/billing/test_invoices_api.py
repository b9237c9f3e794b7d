"""An invoice end to end through the API: run, read, finalize, HTML, immutability, access."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError

from app.billing import repository as billing_repository
from app.settings import get_settings
from tests.billing.world import get, october_with_failure, run_invoice
from tests.harness import Console, bearer


def _october(console: Console, db: Engine) -> dict[str, Any]:
    october_with_failure(console, db)
    return run_invoice(console, "2026-10")


def test_october_invoice_with_a_47_minute_failure_and_a_30_s_migration(
    console: Console, db: Engine, now: datetime
) -> None:
    invoice = _october(console, db)
    lines = [(x["kind"], x["seconds"], x["amount"], x["gpu_uuid"]) for x in invoice["lines"]]
    assert lines == [
        # 31 days = 2,678,400 s x 2.49 / 3600 = 1852.56 (charged, then credited back below)
        ("charge", 2_678_400, "1852.56", None),
        ("failure_credit", 2820, "-1.95", "GPU-A"),  # 47 min: 1.9505
        ("migration_credit", 30, "-0.02", "GPU-A"),  # 0.02075
        ("tax", None, "351.61", None),  # 19 % of 1850.59 = 351.6121
    ]
    assert invoice["lines"][0]["rate"] == "2.49"
    assert invoice["lines"][1]["evidence"]["code"] == invoice["lines"][1]["code"] == 79
    assert invoice["lines"][2]["evidence"] == {
        "from_gpu": "GPU-A",
        "to_gpu": "GPU-B",
        "reason": "XID 79",
    }
    totals = (invoice["subtotal"], invoice["tax"], invoice["total"])
    assert totals == ("1850.59", "351.61", "2202.20")
    assert (invoice["status"], invoice["number"]) == ("draft", None)


def test_an_invoice_whose_lines_take_several_statements_is_stored_whole_and_in_order(
    console: Console, db: Engine, now: datetime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A month of thousands of GPUs' lines is written in chunks (one jsonb array may hold
    256 MiB): here two lines a statement, so the four lines take two."""
    monkeypatch.setattr(billing_repository, "_LINES_PER_STATEMENT", 2)
    invoice = _october(console, db)
    kinds = [(x["position"], x["kind"], x["amount"]) for x in invoice["lines"]]
    assert kinds == [
        (0, "charge", "1852.56"),
        (1, "failure_credit", "-1.95"),
        (2, "migration_credit", "-0.02"),
        (3, "tax", "351.61"),
    ]


def test_running_again_gives_the_same_draft(console: Console, db: Engine, now: datetime) -> None:
    first = _october(console, db)
    again = console.post("/v1/invoices/runs", {"period": "2026-10"}, 200)
    assert again["invoice_ids"] == [first["id"]]
    second = get(console, f"/v1/invoices/{first['id']}")
    assert _stable(second) == _stable(first)
    assert len(get(console, "/v1/invoices")["items"]) == 1


def _stable(invoice: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in invoice.items() if k != "generated_at"}


def test_finalize_numbers_locks_and_issues_the_30_day_tier_voucher(
    console: Console, db: Engine, now: datetime
) -> None:
    draft = _october(console, db)
    final = console.post(f"/v1/invoices/{draft['id']}/finalize", {}, 200)
    assert (final["status"], final["number"]) == ("finalized", "GM-2026-000001")
    assert final["lines"] == draft["lines"] and final["total"] == "2202.20"
    ledger = get(console, f"/v1/customers/{draft['customer_id']}/vouchers")
    # 31-day rental at period end: 15 % of its net 1850.59 = 277.5885 -> 277.59
    assert [(e["kind"], e["amount"], e["source"]) for e in ledger["entries"]] == [
        ("issued", "277.59", "tier")
    ]
    assert ledger["balance"] == "277.59"
    # A second run leaves the finalized invoice untouched.
    again = console.post("/v1/invoices/runs", {"period": "2026-10", "finalize": True}, 200)
    assert again["counts"] == {"unchanged": 1}
    assert get(console, f"/v1/invoices/{draft['id']}") == final


def test_finalizing_before_the_grace_time_is_refused_unless_forced(
    console: Console, db: Engine, now: datetime
) -> None:
    october_with_failure(console, db)
    body = {"period": "2026-11", "finalize": True}
    refused = console.post("/v1/invoices/runs", body, 409)
    assert refused["detail"][0]["loc"] == ["body", "force"]
    assert get(console, "/v1/invoices")["items"] == []
    forced = console.post("/v1/invoices/runs", {**body, "force": True}, 200)
    assert forced["counts"] == {"finalized": 1}


def test_the_database_refuses_to_change_a_finalized_invoice(
    console: Console, db: Engine, now: datetime
) -> None:
    draft = _october(console, db)
    console.post(f"/v1/invoices/{draft['id']}/finalize", {}, 200)
    ident = {"id": draft["id"]}
    for statement in (
        "UPDATE invoices SET total = total - 1 WHERE id = :id",
        "UPDATE invoices SET status = 'draft', number = NULL WHERE id = :id",
        "UPDATE invoice_lines SET amount = 0 WHERE invoice_id = :id",
        "DELETE FROM invoice_lines WHERE invoice_id = :id",
        "DELETE FROM invoices WHERE id = :id",
        "UPDATE voucher_entries SET amount = 1",
    ):
        with (
            pytest.raises(DBAPIError, match=r"immutable|cannot be deleted|append-only"),
            db.begin() as conn,
        ):
            conn.execute(text(statement), ident)
    with db.begin() as conn:  # the Stripe mirror's columns stay writable
        conn.execute(
            text(
                "UPDATE invoices SET stripe_invoice_id = 'in_1', stripe_status = 'open' "
                "WHERE id = :id"
            ),
            ident,
        )
    paid = console.post(f"/v1/invoices/{draft['id']}/paid", {}, 200)
    assert (paid["status"], paid["stripe_invoice_id"], paid["total"]) == ("paid", "in_1", "2202.20")
    console.post(f"/v1/invoices/{draft['id']}/void", {"reason": "x"}, 409)


def test_void_keeps_the_number_and_a_new_draft_replaces_it(
    console: Console, db: Engine, now: datetime
) -> None:
    draft = _october(console, db)
    final = console.post(f"/v1/invoices/{draft['id']}/finalize", {}, 200)
    void = console.post(f"/v1/invoices/{draft['id']}/void", {"reason": "wrong tax id"}, 200)
    assert (void["status"], void["number"], void["void_reason"]) == (
        "void",
        final["number"],
        "wrong tax id",
    )
    rerun = console.post("/v1/invoices/runs", {"period": "2026-10"}, 200)
    assert rerun["counts"] == {"drafted": 1} and rerun["invoice_ids"] != [draft["id"]]
    second = console.post(f"/v1/invoices/{rerun['invoice_ids'][0]}/finalize", {}, 200)
    assert second["number"] == "GM-2026-000002"  # gapless: the voided one keeps 000001
    ledger = get(console, f"/v1/customers/{draft['customer_id']}/vouchers")
    # The voided invoice's tier voucher is taken back (nobody spent it) and the replacement
    # earns it again: it never applies to the replacement itself (tests/billing/
    # test_invoices_void.py).
    assert [e["kind"] for e in ledger["entries"]] == ["issued", "revoked", "issued"]
    assert second["total"] == second["amount_due"] == final["total"]


def test_html_invoice_is_standalone_and_escaped(
    console: Console, db: Engine, now: datetime
) -> None:
    draft = _october(console, db)
    console.client.patch(
        f"/v1/customers/{draft['customer_id']}",
        json={"name": "<script>alert(1)</script> & Co"},
        headers=console.headers,
    )
    final = console.post(f"/v1/invoices/{draft['id']}/finalize", {}, 200)
    response = console.client.get(f"/v1/invoices/{draft['id']}/html", headers=console.headers)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    page = response.text
    assert final["number"] in page and "$2,202.20" in page and "-$1.95" in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt; &amp; Co" in page and "<script>" not in page
    assert "GPU-A" in page and "Failure credit" in page and "http" not in page


@pytest.fixture
def seller(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("GPUMETER_SELLER_NAME", "Example GPU Cloud GmbH")
    monkeypatch.setenv("GPUMETER_SELLER_ADDRESS", "Hauptstr. 1\n10115 Berlin")
    monkeypatch.setenv("GPUMETER_SELLER_TAX_ID", "DE123456789")
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()  # later tests read the environment without these again


def test_the_invoice_document_is_an_invoice(
    console: Console, db: Engine, now: datetime, seller: None
) -> None:
    """Seller, due date from the payment terms (30 days), tax once as a percentage, the
    credits summary (2,820 + 30 s = 0.79 GPU-hours, one incident: the failure and its
    migration window), evidence in words, no internal ids."""
    draft = _october(console, db)
    final = console.post(f"/v1/invoices/{draft['id']}/finalize", {}, 200)
    assert (final["finalized_at"], final["due_at"]) == (
        "2026-11-05T12:00:00Z",
        "2026-12-05T12:00:00Z",
    )
    page = console.client.get(f"/v1/invoices/{draft['id']}/html", headers=console.headers).text
    assert "Example GPU Cloud GmbH" in page and "10115 Berlin" in page
    assert "Tax id: DE123456789" in page
    assert "Due 2026-12-05 12:00:00 UTC" in page
    assert page.count("19 %") == 1 and "0.19" not in page and page.count("351.61") == 1
    assert "0.79 GPU-hours credited for 1 incident" in page
    assert "evidence: XID 79: GPU has fallen off the bus" in page
    # Quantities in the price's unit with the seconds beside, and each sum redone in words.
    assert "0.7833 GPU-h (2,820 s)" in page and "2.49 USD/GPU-h" in page
    assert "2,820 s \u00d7 2.49 USD/h = 1.9505 USD" in page
    assert "evidence: migrated from GPU-A to GPU-B: XID 79" in page
    assert "migration_id" not in page and "ev-79" not in page


def test_customers_see_only_their_own_invoices(console: Console, db: Engine, now: datetime) -> None:
    draft = _october(console, db)
    other = console.customer("Other")
    own_key = console.post(f"/v1/customers/{draft['customer_id']}/keys", {"name": "a"})["key"]
    other_key = console.post(f"/v1/customers/{other['id']}/keys", {"name": "b"})["key"]
    client = console.client
    assert client.get(f"/v1/invoices/{draft['id']}", headers=bearer(own_key)).status_code == 200
    assert client.get(f"/v1/invoices/{draft['id']}", headers=bearer(other_key)).status_code == 404
    assert client.get("/v1/invoices", headers=bearer(other_key)).json()["items"] == []
    run = client.post("/v1/invoices/runs", json={"period": "2026-10"}, headers=bearer(own_key))
    assert run.status_code == 403


def test_a_run_as_of_a_time_is_judged_then(console: Console, db: Engine, now: datetime) -> None:
    october_with_failure(console, db)
    runs = "/v1/invoices/runs"
    future = console.post(runs, {"period": "2026-10", "as_of": "2026-11-06T00:00:00Z"}, 422)
    assert future["detail"][0]["loc"] == ["body", "as_of"]
    # 1 Nov 03:00 is before October's grace end (00:00 + 6 h): finalizing then is refused.
    early = {"period": "2026-10", "finalize": True, "as_of": "2026-11-01T03:00:00Z"}
    console.post(runs, early, 409)
    run = console.post(runs, {**early, "as_of": "2026-11-01T06:00:00Z"}, 200)
    invoice = get(console, f"/v1/invoices/{run['invoice_ids'][0]}")
    assert (invoice["generated_at"], invoice["finalized_at"]) == (
        "2026-11-01T06:00:00Z",
        "2026-11-01T06:00:00Z",
    )
