"""FOCUS 1.2's column rules as a checker, written from the specification, not from the export.

Source: specification/columns/*.md and specification/attributes/*.md at tag v1.2 of
FinOps-Open-Cost-and-Usage-Spec/FOCUS_Spec. Each check names the requirement it encodes.
Only the MUSTs that apply to a provider like this one are here: no commitment discounts,
capacity reservations, availability zones, tags or virtual currency; it publishes unit prices
(plans), has contract prices, measures usage, bills provisioned resources (rentals) with types,
sub accounts and regions (datacenters). ``violations(rows)`` lists what breaks a rule.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from decimal import Decimal

MANDATORY = {
    # column: (data type, allows nulls), from each column's Content Constraints table
    "BilledCost": ("Decimal", False),
    "BillingAccountId": ("String", False),
    "BillingAccountName": ("String", True),
    "BillingCurrency": ("String", False),
    "BillingPeriodEnd": ("Date/Time", False),
    "BillingPeriodStart": ("Date/Time", False),
    "ChargeCategory": ("String", False),
    "ChargeClass": ("String", True),
    "ChargeDescription": ("String", True),
    "ChargePeriodEnd": ("Date/Time", False),
    "ChargePeriodStart": ("Date/Time", False),
    "ContractedCost": ("Decimal", False),
    "EffectiveCost": ("Decimal", False),
    "InvoiceIssuerName": ("String", False),
    "ListCost": ("Decimal", False),
    "PricingQuantity": ("Decimal", True),
    "PricingUnit": ("String", True),
    "ProviderName": ("String", False),
    "PublisherName": ("String", False),
    "ServiceCategory": ("String", False),
    "ServiceName": ("String", False),
}
# Conditional columns whose condition this provider meets (CostAndUsage-D-*-C).
CONDITIONAL = {
    "ConsumedQuantity": ("Decimal", True),  # USAGE_MEASUREMENT_SUPPORTED
    "ConsumedUnit": ("String", True),
    "ContractedUnitPrice": ("Decimal", True),  # NEGOTIATED_PRICING_SUPPORTED
    "ListUnitPrice": ("Decimal", True),  # PUBLIC_PRICE_LIST_SUPPORTED
    "RegionId": ("String", True),  # REGION_SUPPORTED
    "RegionName": ("String", True),
    "ResourceId": ("String", True),  # BILLING_BASED_ON_PROVISIONED_RESOURCES_SUPPORTED
    "ResourceName": ("String", True),
    "ResourceType": ("String", True),
    "SkuId": ("String", True),  # PUBLIC_PRICE_LIST_SUPPORTED and UNIT_PRICING_SUPPORTED
    "SkuMeter": ("String", True),
    "SkuPriceDetails": ("String", True),
    "SkuPriceId": ("String", True),
    "SubAccountId": ("String", True),  # SUB_ACCOUNT_SUPPORTED
    "SubAccountName": ("String", True),
}
CHARGE_CATEGORIES = {"Usage", "Purchase", "Tax", "Credit", "Adjustment"}
CHARGE_FREQUENCIES = {"One-Time", "Recurring", "Usage-Based"}
PRICING_CATEGORIES = {"Standard", "Dynamic", "Committed", "Other"}
SKU_PRICE_PROPERTIES = {  # SkuPriceDetails' FOCUS-defined keys (the rest must start x_)
    "CoreCount",
    "DiskMaxIops",
    "DiskSpace",
    "DiskType",
    "GpuCount",
    "InstanceType",
    "InstanceSeries",
    "MemorySize",
    "NetworkMaxIops",
    "NetworkMaxThroughput",
    "OperatingSystem",
    "Redundancy",
    "StorageClass",
}
# NumericFormat: an integer, a decimal or E notation; no sign for positives, no separators.
NUMERIC = re.compile(r"^-?\d+(\.\d+)?(E-?\d+)?$")
# DateTimeFormat: ISO 8601 in UTC, "YYYY-MM-DDTHH:mm:ssZ".
DATETIME = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$")
COLUMN_ID = re.compile(r"^[A-Z][A-Za-z0-9]*$")  # ColumnHandling: Pascal case, alphanumeric
UNIT = re.compile(r"^[A-Z][A-Za-z]*(-[A-Z][a-z]+)?$")  # UnitFormat: "Hours", "GB-Hours"


def _d(value: str) -> Decimal | None:
    return None if value == "" else Decimal(value)


def violations(rows: list[dict[str, str]]) -> list[str]:
    """Every broken rule, as "<rule>: <row number> <detail>"; an empty list when none."""
    out: list[str] = []
    if not rows:
        return ["no rows"]
    columns = list(rows[0])
    for name in [*MANDATORY, *CONDITIONAL]:
        if name not in columns:
            out.append(f"CostAndUsage-D: column {name} missing")
    for name in columns:
        if not (COLUMN_ID.match(name) or name.startswith("x_")):
            out.append(f"ColumnHandling-A-010: custom column {name} lacks the x_ prefix")
    custom = [i for i, name in enumerate(columns) if name.startswith("x_")]
    if custom and custom != list(range(len(columns) - len(custom), len(columns))):
        out.append("ColumnHandling-A-013: custom columns are not after the FOCUS ones")
    parents: dict[str, set[str]] = defaultdict(set)
    for n, row in enumerate(rows, start=2):  # the CSV's line numbers

        def bad(rule: str, detail: str, n: int = n) -> None:
            out.append(f"{rule}: line {n} {detail}")

        for name, (kind, nullable) in {**MANDATORY, **CONDITIONAL}.items():
            value = row.get(name, "")
            if value == "":
                if not nullable:
                    bad(f"{name}-C-NotNull", "is null")
            elif kind == "Decimal" and not NUMERIC.match(value):
                bad("NumericFormat-A", f"{name}={value!r}")
            elif kind == "Date/Time" and not DATETIME.match(value):
                bad("DateTimeFormat-A", f"{name}={value!r}")
            elif kind == "String" and value.strip() == "":
                bad("StringHandling-A-007", f"{name} is blank")
        category, correction = row["ChargeCategory"], row["ChargeClass"] == "Correction"
        if category not in CHARGE_CATEGORIES:
            bad("ChargeCategory-C-003", category)
        if row["ChargeClass"] not in ("", "Correction"):
            bad("ChargeClass-C-005", row["ChargeClass"])
        if row.get("ChargeFrequency", "One-Time") not in CHARGE_FREQUENCIES:
            bad("ChargeFrequency-C-003", row["ChargeFrequency"])
        if row["ChargePeriodStart"] >= row["ChargePeriodEnd"]:
            bad("ChargePeriodEnd", "does not follow ChargePeriodStart")
        if row["PricingCategory"] and row["PricingCategory"] not in PRICING_CATEGORIES:
            bad("PricingCategory-C-007", row["PricingCategory"])
        priced_columns = [
            "ListUnitPrice",
            "ContractedUnitPrice",
            "PricingQuantity",
            "PricingCategory",
            "SkuId",
            "SkuPriceId",
        ]
        for name in priced_columns:
            if category == "Tax" and row[name] != "":
                bad(f"{name} (null when Tax)", row[name])
            if category in ("Usage", "Purchase") and not correction and row[name] == "":
                bad(f"{name} (not null on Usage)", "is null")
        consumed = _d(row["ConsumedQuantity"])
        if category != "Usage" and consumed is not None:
            bad("ConsumedQuantity-C-004", f"set on a {category} row")
        if category == "Usage" and not correction and consumed is None:
            bad("ConsumedQuantity-C-006", "null on a Usage row")
        if (consumed is None) != (row["ConsumedUnit"] == ""):
            bad("ConsumedUnit-C-005/006", "null unless ConsumedQuantity is")
        quantity = _d(row["PricingQuantity"])
        if (quantity is None) != (row["PricingUnit"] == ""):
            bad("PricingUnit-C-005/006", "null unless PricingQuantity is")
        for unit in ("PricingUnit", "ConsumedUnit"):
            if row[unit] and not UNIT.match(row[unit]):
                bad("UnitFormat-A-001", f"{unit}={row[unit]!r}")
        billed = Decimal(row["BilledCost"])
        for price, cost in (
            ("ListUnitPrice", "ListCost"),
            ("ContractedUnitPrice", "ContractedCost"),
        ):
            unit_price = _d(row[price])
            if unit_price is not None and unit_price < 0:
                bad(f"{price}-C-009", "negative")
            priced = unit_price is not None and quantity is not None and not correction
            if priced and unit_price * quantity != Decimal(row[cost]):  # type: ignore[operator]
                bad(f"{cost}-C-009", f"{row[price]} x {row['PricingQuantity']} != {row[cost]}")
            if unit_price is None and category == "Credit" and Decimal(row[cost]) != billed:
                bad(f"{cost}-C-008", "a credit's cost must match BilledCost")
        if category == "Credit" and Decimal(row["EffectiveCost"]) != billed:
            bad("EffectiveCost-C-010", "a credit's effective cost must match BilledCost")
        if row["SkuId"] == "" and row["SkuMeter"] != "":
            bad("SkuMeter-C-004", "set without SkuId")
        if row["SkuPriceId"] == "" and row["SkuPriceDetails"] != "":
            bad("SkuPriceDetails-C-004", "set without SkuPriceId")
        if row["SkuPriceId"]:
            parents[row["SkuPriceId"]].add(row["SkuId"])
        if row["SkuPriceDetails"]:
            details = json.loads(row["SkuPriceDetails"])
            if not isinstance(details, dict):
                bad("KeyValueFormat-A", "not a JSON object")
            else:
                for key, value in details.items():
                    if isinstance(value, dict | list):
                        bad("KeyValueFormat-A", f"{key} is not a scalar")
                    if key not in SKU_PRICE_PROPERTIES and not key.startswith("x_"):
                        bad("SkuPriceDetails-C-017", f"{key} is neither FOCUS-defined nor x_")
        if (row["RegionId"] == "") != (row["RegionName"] == ""):
            bad("RegionName-C-004/005", "null unless RegionId is")
        if (row["ResourceId"] == "") != (row["ResourceType"] == ""):
            bad("ResourceType-C-004/005", "null unless ResourceId is")
        if row["ResourceId"] == "" and row["ResourceName"] != "":
            bad("ResourceName-C-004", "set without ResourceId")
        if row["ResourceName"] and row["ResourceName"] == row["ResourceId"]:
            bad("ResourceName-C-006", "duplicates ResourceId")
        if (row["SubAccountId"] == "") != (row["SubAccountName"] == ""):
            bad("SubAccountName-C-004/005", "null unless SubAccountId is")
    for price_id, skus in parents.items():
        if len(skus) != 1:
            out.append(f"SkuPriceId-C-008: {price_id} has parents {sorted(skus)}")
    return out
