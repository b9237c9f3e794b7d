"""The FOCUS 1.2 export against the specification: the FinOps Foundation's own validator
(CI installs it: .ci/focus-validator) and this suite's encoding of the spec's column rules
(tests/dashboard/focus_rules.py), on a month with contract prices, a binding cap, failure and
migration credits, tax and a prepaid balance, over two datacenters and several tenants."""

from __future__ import annotations

import csv
import io
import os
import subprocess
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.billing.core.lines import CREDIT_KINDS, LineKind
from app.billing.loader import billing_period
from app.billing.models import InvoiceLineRow
from app.dashboard import focus
from app.dashboard.exports import Statement, day_parts
from tests.dashboard import focus_rules
from tests.dashboard.world import END, PERIOD, START, World, _ingest, _minutes, build, ts
from tests.harness import Console, bearer

# What this provider supports, in the validator's terms (its --applicability-criteria).
APPLICABLE = [
    "ACCOUNT_NAMING_SUPPORTED",
    "BILLING_BASED_ON_PROVISIONED_RESOURCES_SUPPORTED",
    "NEGOTIATED_PRICING_SUPPORTED",
    "PUBLIC_PRICE_LIST_SUPPORTED",
    "REGION_SUPPORTED",
    "RESOURCE_TYPE_ASSIGNMENT_SUPPORTED",
    "SUB_ACCOUNT_SUPPORTED",
    "UNIT_PRICING_SUPPORTED",
    "USAGE_MEASUREMENT_SUPPORTED",
]
LIST_PRICE, CONTRACT_PRICE, CAP = Decimal("2.49"), Decimal("1.99"), Decimal("1000")


@dataclass
class Month:
    world: World
    beta: dict[str, Any]  # a customer on a contract price with a binding cap, in ams1
    beta_key: str
    beta_invoice: dict[str, Any]


def _beta(console: Console, plan_id: str) -> tuple[dict[str, Any], str, dict[str, Any]]:
    beta = console.customer("Beta", currency="EUR", billing_timezone="UTC", tax_rate="0.21")
    console.post(
        f"/v1/plans/{plan_id}/prices",
        {
            "gpu_model": "H100",
            "price_per_hour": str(CONTRACT_PRICE),
            "monthly_cap_per_gpu": str(CAP),
            "effective_from": "2026-01-01T00:00:00Z",
            "customer_id": beta["id"],
        },
    )
    node = console.post("/v1/nodes", {"hostname": "node-ams-1", "datacenter": "ams1"})
    for gpu in ("GPU-C-1", "GPU-C-2"):
        console.gpu(node["node"]["id"], gpu)
    rental = console.rental(beta["id"], plan_id, start_at=START, end_at=END, gpu_count=2)
    for gpu in ("GPU-C-1", "GPU-C-2"):
        console.assign(rental["id"], gpu, START)
    records = [*_minutes("GPU-C-1", ts(START), ts(END)), *_minutes("GPU-C-2", ts(START), ts(END))]
    _ingest(console.client, node["token"]["key"], records, [])
    console.post(f"/v1/customers/{beta['id']}/balance/top-ups", {"amount": "25", "reason": "t"})
    key = console.post(f"/v1/customers/{beta['id']}/keys", {"name": "finance"})["key"]
    run = console.post(
        "/v1/invoices/runs",
        {"period": PERIOD, "customer_id": beta["id"], "finalize": True, "force": True},
        status=200,
    )
    invoice = console.client.get(f"/v1/invoices/{run['invoice_ids'][0]}", headers=console.headers)
    return beta, key, invoice.json()


@pytest.fixture
def month(console: Console) -> Month:
    world = build(console)
    plan_id = world.acme.rental["plan_id"]
    beta, key, invoice = _beta(console, plan_id)
    return Month(world, beta, key, invoice)


def export(client: TestClient, customer_id: str, key: str) -> str:
    path = f"/v1/customers/{customer_id}/exports/focus.csv?period={PERIOD}"
    response = client.get(path, headers=bearer(key))
    assert response.status_code == 200, response.text
    return response.text


def rows_of(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


def payable(invoice: dict[str, Any]) -> Decimal:
    """The invoice's total before the prepaid balance paid part of it (a payment, not a
    charge): what FOCUS's BilledCost sums to (BilledCost-C-007)."""
    return sum(
        (Decimal(line["amount"]) for line in invoice["lines"] if line["kind"] != "prepaid_balance"),
        Decimal(0),
    )


def test_the_export_meets_the_specs_column_rules(client: TestClient, month: Month) -> None:
    w = month.world
    for customer, key, invoice in [
        (w.acme.customer, w.acme.key, w.invoice),
        (month.beta, month.beta_key, month.beta_invoice),
    ]:
        rows = rows_of(export(client, customer["id"], key))
        assert focus_rules.violations(rows) == []
        assert sum(Decimal(r["BilledCost"]) for r in rows) == payable(invoice)
        assert {r["InvoiceId"] for r in rows} == {invoice["number"]}


def test_contract_price_cap_and_prepaid_balance(client: TestClient, month: Month) -> None:
    rows = rows_of(export(client, month.beta["id"], month.beta_key))
    usage = [r for r in rows if r["ChargeCategory"] == "Usage"]
    # Two GPUs for two days: 96 GPU-hours, at the published 2.49 and the contracted 1.99.
    assert sum(Decimal(r["PricingQuantity"]) for r in usage) == Decimal(96)
    assert {(r["ListUnitPrice"], r["ContractedUnitPrice"]) for r in usage} == {("2.49", "1.99")}
    assert sum(Decimal(r["ListCost"]) for r in usage) == Decimal("239.04")
    assert sum(Decimal(r["ContractedCost"]) for r in usage) == Decimal("191.04")
    # The cap (1,000.00 a GPU-month, prorated: 2 GPUs x 2 of 31 days = 129.03) is on the
    # usage rows it discounts, not a row of its own; the balance paid is no row at all.
    cap = Decimal("129.03") - Decimal("191.04")
    assert sum(Decimal(r["x_CapReduction"]) for r in usage) == cap
    assert sum(Decimal(r["BilledCost"]) for r in usage) == Decimal("129.03")
    assert {r["x_LineKind"] for r in rows} == {"charge", "tax"}
    assert [r["BilledCost"] for r in rows if r["ChargeCategory"] == "Tax"] == ["27.10"]
    # Region, resource and SKU price: the datacenter, the rental, the published price row.
    assert {r["RegionId"] for r in usage} == {"ams1"}
    assert len({r["ResourceId"] for r in usage}) == 1 and {r["ResourceType"] for r in usage} == {
        "GPU rental"
    }
    assert {r["SkuId"] for r in usage} == {"H100"}
    assert len({r["SkuPriceId"] for r in usage}) == 1
    # Every cost has its currency's two places or is an exact product: no ten-place zeros.
    for r in rows:
        for name in ("BilledCost", "EffectiveCost", "x_CapReduction"):
            assert r[name] == "" or len(r[name].split(".")[1]) == 2, (name, r[name])


def test_credit_rows_recompute_as_price_times_negative_quantity(
    client: TestClient, month: Month
) -> None:
    w = month.world
    rows = rows_of(export(client, w.acme.customer["id"], w.acme.key))
    credits = [r for r in rows if r["ChargeCategory"] == "Credit" and r["x_GpuUuid"]]
    assert credits
    for r in credits:
        quantity = Decimal(r["PricingQuantity"])
        assert quantity < 0 and Decimal(r["ListCost"]) < 0 and Decimal(r["BilledCost"]) < 0
        assert Decimal(r["ListUnitPrice"]) * quantity == Decimal(r["ListCost"])
        # The rental is the resource (its charges and credits net per ResourceId); the GPU
        # is named beside it, never as the resource's name.
        assert r["ResourceId"] == w.acme.rental["id"] and r["ResourceName"] != r["x_GpuUuid"]
        assert r["RegionId"] == "fra1"
    failure = [r for r in credits if r["x_LineKind"] == "failure_credit"]
    assert [(r["x_GpuSeconds"], r["PricingQuantity"]) for r in failure] == [("2820", "-0.783333")]


def test_every_line_kind_maps_including_credit_notes_and_ten_place_amounts() -> None:
    """Straight from stored lines (amounts with the database's ten places): every kind a
    statement can hold has a row, and a credit note's line no longer raises KeyError."""
    period = billing_period(PERIOD, "UTC")
    start, end = period.start, period.end
    money = Decimal("0.0000000000")
    lines = [
        InvoiceLineRow(kind=kind, amount=Decimal(amount) + money, rate=rate, start_at=s, end_at=e)
        for kind, amount, rate, s, e in [
            (LineKind.CHARGE, "10.00", Decimal("2.5"), start, end),
            (LineKind.ADJUSTMENT, "-3.00", Decimal("2.5"), None, None),
            (LineKind.CREDIT_NOTE, "3.00", None, None, None),
            (LineKind.CAP, "-1.50", None, None, None),
            (LineKind.VOUCHER, "-0.50", None, None, None),
            (LineKind.TAX, "1.52", Decimal("0.19"), None, None),
            (LineKind.PREPAID_BALANCE, "-2.00", None, None, None),
        ]
    ]
    lines[0].seconds = 14400
    source = Statement(period, "EUR", None, tuple(lines))
    book = focus.Catalogue({}, {}, {})
    customer = type("C", (), {"id": "c-1", "name": "Acme"})()
    text = "".join(focus.focus_csv(day_parts(None, source), source, customer, "gpumeter", book))  # type: ignore[arg-type]
    rows = rows_of(text)
    kinds = {r["x_LineKind"]: r for r in rows}
    assert set(kinds) == {k.value for k in LineKind if k not in _NOT_ON_STATEMENT}
    assert kinds["credit_note"]["ChargeClass"] == "Correction"
    assert sum(Decimal(r["BilledCost"]) for r in rows) == Decimal("9.52")  # balance: a payment
    for r in rows:
        assert "0000000" not in r["BilledCost"] + r["ListCost"] + r["ContractedCost"], r


_NOT_ON_STATEMENT = {*CREDIT_KINDS, LineKind.PREPAID_BALANCE}  # credits: the API test's


# --- the FinOps Foundation's validator ------------------------------------------------------

VALIDATOR = os.environ.get("GPUMETER_FOCUS_VALIDATOR", "")
# Rules of focus-validator 2.2.1's model (rules/model-1.2.0.1.json) that no dataset can pass,
# checked against the v1.2 specification's text, each with the reason. Their parents
# (composites) fail with them.
VALIDATOR_DEFECTS = {
    "InvoiceId-C-004-C :: Nullability": "has no condition: demands a null InvoiceId on every "
    "row, which InvoiceId-C-005-C forbids on the rows of an issued invoice",
    "ConsumedQuantity-C-005-C :: Composite": "its ConsumedQuantity-C-006-C has the condition "
    'inverted (ChargeClass = "Correction"; the spec: ChargeClass is not "Correction")',
    "ConsumedQuantity-C-003-C :: Composite": "parent of ConsumedQuantity-C-005-C",
    "ConsumedQuantity-C-000-C :: Composite": "parent of ConsumedQuantity-C-003-C",
}


def _validate(csv_path: Path, report: Path) -> list[tuple[str, str]]:
    """The validator's failed MUST rules on the file, as (rule id, message)."""
    binary = Path(VALIDATOR)
    # It reads its currency list by a path relative to its package's parent directory.
    site = subprocess.run(
        [
            binary.parent / "python",
            "-c",
            "import focus_validator, os; "
            "print(os.path.dirname(os.path.dirname(focus_validator.__file__)))",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    done = subprocess.run(
        [
            binary,
            "--data-file",
            csv_path,
            "--validate-version",
            focus.FOCUS_VERSION,
            "--block-download",
            "--applicability-criteria",
            ",".join(APPLICABLE),
            "--output-type",
            "unittest",
            "--output-destination",
            report,
        ],
        cwd=site,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0 and report.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    failed = []
    for case in ET.parse(report).iter("testcase"):
        failure = case.find("failure")
        if failure is not None:
            failed.append((case.get("name", ""), failure.text or failure.get("message") or ""))
    return failed


@pytest.mark.skipif(
    not VALIDATOR and os.environ.get("CI") != "true",
    reason="GPUMETER_FOCUS_VALIDATOR not set (CI installs it: .ci/focus-validator)",
)
def test_the_finops_foundation_validator_passes_the_export(
    client: TestClient, month: Month, tmp_path: Path
) -> None:
    assert VALIDATOR, "CI must set GPUMETER_FOCUS_VALIDATOR (.ci/focus-validator installs it)"
    w = month.world
    for name, customer, key in [
        ("acme", w.acme.customer, w.acme.key),
        ("beta", month.beta, month.beta_key),
    ]:
        path = tmp_path / f"{name}.csv"
        path.write_text(export(client, customer["id"], key))
        failed = {rule for rule, _ in _validate(path, tmp_path / f"{name}.xml")}
        unexplained = sorted(failed - set(VALIDATOR_DEFECTS))
        assert unexplained == [], unexplained
        # A defect fixed in a later validator shows here: drop it from the list.
        assert failed == set(VALIDATOR_DEFECTS), sorted(failed)
