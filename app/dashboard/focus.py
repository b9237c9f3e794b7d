"""The FOCUS 1.2 cost and usage export (FinOps Open Cost and Usage Specification).

Rows are the export's day parts (``app.dashboard.exports``) of the period's invoice lines,
mapped column by column as docs/focus.md says; that document is the reference, this module
the implementation. In short:

- unit price x quantity = cost, exactly, on every priced row: ``PricingQuantity`` is the
  row's GPU-hours to six places (negative on a credit row), ``ListCost`` and
  ``ContractedCost`` are the exact products (as many places as that takes), ``BilledCost``
  is the invoice's money in the currency's minor unit (the day parts of a line sum to it);
- ``ListUnitPrice`` is the plan's published price, ``ContractedUnitPrice`` the one billed
  (a customer's contract price where it has one); ``SkuPriceId`` names the published price;
- the monthly cap is a discount: it lowers the billed and effective cost of the rental's
  own usage rows (``x_CapReduction`` says by how much) instead of a row of its own;
- the prepaid balance is a payment, not a charge: it has no row, so ``BilledCost`` sums to
  the invoice's total before the balance paid part of it.
"""

from __future__ import annotations

import json
import uuid
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from decimal import ROUND_HALF_EVEN, Decimal
from enum import StrEnum
from zoneinfo import ZoneInfo

from sqlalchemy.orm import Session

from app.billing import reads as billing_reads
from app.billing import wording as billing_wording
from app.billing.core.lines import CREDIT_KINDS, LineKind
from app.core.epoch import epoch, from_epoch
from app.core.money import minor_units
from app.customers.models import Customer
from app.dashboard.exports import DayPart, Statement, csv_chunks
from app.dashboard.formatting import Formatter
from app.dashboard.rental_labels import label
from app.fleet import reads as fleet_reads
from app.plans.service import price_rows
from app.rentals import reads as rentals_reads
from app.rentals.reads import served

FOCUS_VERSION = "1.2"
HOURS = Decimal("0.000001")  # PricingQuantity's places: a hundredth of a second and finer
UNIT = "GPU-Hours"  # UnitFormat's <singular-unit>-<plural-time-units>, as "GB-Hours"


class Level(StrEnum):
    MANDATORY = "Mandatory"
    CONDITIONAL = "Conditional"
    RECOMMENDED = "Recommended"
    CUSTOM = "Custom"


@dataclass(frozen=True)
class Column:
    name: str
    level: Level
    nullable: bool
    type: str  # String | Decimal | Date/Time | JSON, as the spec writes them


def _c(name: str, level: Level, nullable: bool, type_: str = "String") -> Column:
    return Column(name, level, nullable, type_)


M, C, R, X = Level.MANDATORY, Level.CONDITIONAL, Level.RECOMMENDED, Level.CUSTOM
# The FOCUS 1.2 columns written (every Mandatory one and every Conditional one whose condition
# this provider meets), in the spec's alphabetical order, then the custom ones.
FOCUS_COLUMNS = (
    _c("BilledCost", M, False, "Decimal"),
    _c("BillingAccountId", M, False),
    _c("BillingAccountName", M, True),
    _c("BillingCurrency", M, False),
    _c("BillingPeriodEnd", M, False, "Date/Time"),
    _c("BillingPeriodStart", M, False, "Date/Time"),
    _c("ChargeCategory", M, False),
    _c("ChargeClass", M, True),
    _c("ChargeDescription", M, True),
    _c("ChargeFrequency", R, False),
    _c("ChargePeriodEnd", M, False, "Date/Time"),
    _c("ChargePeriodStart", M, False, "Date/Time"),
    _c("ConsumedQuantity", C, True, "Decimal"),
    _c("ConsumedUnit", C, True),
    _c("ContractedCost", M, False, "Decimal"),
    _c("ContractedUnitPrice", C, True, "Decimal"),
    _c("EffectiveCost", M, False, "Decimal"),
    _c("InvoiceId", R, True),
    _c("InvoiceIssuerName", M, False),
    _c("ListCost", M, False, "Decimal"),
    _c("ListUnitPrice", C, True, "Decimal"),
    _c("PricingCategory", C, True),
    _c("PricingCurrency", C, True),
    _c("PricingCurrencyContractedUnitPrice", C, True, "Decimal"),
    _c("PricingCurrencyEffectiveCost", C, True, "Decimal"),
    _c("PricingCurrencyListUnitPrice", C, True, "Decimal"),
    _c("PricingQuantity", M, True, "Decimal"),
    _c("PricingUnit", M, True),
    _c("ProviderName", M, False),
    _c("PublisherName", M, False),
    _c("RegionId", C, True),
    _c("RegionName", C, True),
    _c("ResourceId", C, True),
    _c("ResourceName", C, True),
    _c("ResourceType", C, True),
    _c("ServiceCategory", M, False),
    _c("ServiceName", M, False),
    _c("ServiceSubcategory", R, False),
    _c("SkuId", C, True),
    _c("SkuMeter", C, True),
    _c("SkuPriceDetails", C, True, "JSON"),
    _c("SkuPriceId", C, True),
    _c("SubAccountId", C, True),
    _c("SubAccountName", C, True),
    _c("x_LineKind", X, False),
    _c("x_GpuSeconds", X, True, "Decimal"),
    _c("x_GpuUuid", X, True),
    _c("x_CapReduction", X, True, "Decimal"),
)

# Every credit kind (CREDIT_KINDS) is a "Credit" row, described by its invoice label.
_CATEGORY = {
    LineKind.CHARGE: "Usage",
    LineKind.CAP: "Adjustment",  # only where no usage row of its rental could take it
    LineKind.ADJUSTMENT: "Usage",  # a correction of an earlier period's usage
    LineKind.CREDIT_NOTE: "Adjustment",
    LineKind.VOUCHER: "Credit",
    LineKind.TAX: "Tax",
}
_DESCRIPTION = {
    LineKind.CHARGE: "GPU time",
    LineKind.FAILURE_CREDIT: "Credit for time the GPU had failed",
    LineKind.MIGRATION_CREDIT: "Credit for time moving to another GPU",
    LineKind.DEGRADED_CREDIT: "Credit for time the GPU was degraded",
    LineKind.STALL_CREDIT: "Credit for time the job waited on another GPU's failure",
    LineKind.CAP: "Monthly cap",
    LineKind.ADJUSTMENT: "Correction of an earlier period",
    LineKind.CREDIT_NOTE: "Part of an earlier period's correction issued as a credit note",
    LineKind.VOUCHER: "Long-rental voucher applied",
    LineKind.TAX: "Tax",
}
# Kinds a unit price and a quantity describe (GPU time, charged or credited).
_PRICED = {LineKind.CHARGE, LineKind.ADJUSTMENT, *CREDIT_KINDS}
_CORRECTIONS = {LineKind.ADJUSTMENT, LineKind.CREDIT_NOTE}


@dataclass(frozen=True)
class Sku:
    """A published price: its id in the plan's price list (``GET /v1/plans/{id}/prices``)."""

    price_id: int
    price: Decimal
    preemptible: bool

    @property
    def sku_price_id(self) -> str:
        return f"plan-price-{self.price_id}" + ("-preemptible" if self.preemptible else "")


@dataclass(frozen=True)
class RentalFacts:
    label: str  # SubAccountName: its own name, else its GPUs and dates
    name: str | None  # ResourceName: the name the customer gave it, if any
    plan_id: uuid.UUID
    gpu_model: str
    preemptible: bool
    region: str | None  # the datacenter it ran in (most of its seconds there)


# A plan's price row: effective from, its id, the price, the preemptible price, and whether
# it is published (not a customer's contract price).
_PricePoint = tuple[int, int, Decimal, Decimal | None, bool]


@dataclass
class Catalogue:
    """What the rows need besides the lines: rentals, regions, published prices, caps."""

    rentals: dict[uuid.UUID, RentalFacts]
    gpu_regions: dict[str, str]
    prices: dict[tuple[uuid.UUID, str], list[_PricePoint]]
    # Per rental: its cap line's amount (negative) and its charge lines' sum, where the cap
    # can be folded into those charge rows.
    caps: dict[uuid.UUID, tuple[Decimal, Decimal]] = field(default_factory=dict)

    def list_price(self, facts: RentalFacts, at: int) -> Sku | None:
        """The published price in effect at ``at`` (the preemptible one for such a rental);
        with none published, the customer's own contract price (its own list price)."""
        points = self.prices.get((facts.plan_id, facts.gpu_model), [])
        for published in (True, False):
            found = None
            for start, row_id, price, preemptible, public in points:
                if start > at:
                    break
                if public != published:
                    continue
                if facts.preemptible and preemptible is not None:
                    found = Sku(row_id, preemptible, True)
                elif not facts.preemptible:
                    found = Sku(row_id, price, False)
            if found is not None:
                return found
        return None


def catalogue(session: Session, customer: Customer, source: Statement, fmt: Formatter) -> Catalogue:
    """Everything but the lines, read before the rows stream (a few queries)."""
    sums = _line_sums(session, source)
    rental_ids = {rental_id for rental_id, _ in sums if rental_id is not None}
    rentals = rentals_reads.rentals_of(session, customer.id, rental_ids) if rental_ids else []
    regions = _rental_regions(session, customer, rental_ids)
    facts = {
        r.id: RentalFacts(
            # ASCII: the FinOps Foundation's validator refuses other characters here (the
            # spec allows any Unicode; a name the customer gave is kept as given).
            r.name or label(r, fmt).replace("\u00d7", "x"),
            r.name,
            r.plan_id,
            r.gpu_model,
            r.preemptible,
            regions.get(r.id),
        )
        for r in rentals
    }
    prices: dict[tuple[uuid.UUID, str], list[_PricePoint]] = defaultdict(list)
    for plan_id in {f.plan_id for f in facts.values()}:
        for p in price_rows(session, plan_id, customer.id):
            prices[plan_id, p.gpu_model].append(
                (
                    epoch(p.effective_from),
                    p.id,
                    p.price_per_hour,
                    p.preemptible_price_per_hour,
                    p.customer_id is None,
                )
            )
    for points in prices.values():
        points.sort()
    caps = {
        rental_id: (amount, sums[rental_id, LineKind.CHARGE])
        for (rental_id, kind), amount in sums.items()
        if kind is LineKind.CAP and rental_id is not None and sums.get((rental_id, LineKind.CHARGE))
    }
    gpus = fleet_reads.gpu_places(session, _credited_gpus(session, source))
    gpu_regions = {gpu: datacenter for gpu, (_, datacenter) in gpus.items()}
    return Catalogue(facts, gpu_regions, prices, caps)


def _line_sums(
    session: Session, source: Statement
) -> dict[tuple[uuid.UUID | None, LineKind], Decimal]:
    if source.invoice is not None:
        rows = billing_reads.line_sums(session, source.invoice.id)
        return {(rental_id, LineKind(kind)): amount for rental_id, kind, amount in rows}
    out: dict[tuple[uuid.UUID | None, LineKind], Decimal] = defaultdict(Decimal)
    for line in source.to_date:
        out[line.rental_id, LineKind(line.kind)] += line.amount
    return dict(out)


def _credited_gpus(session: Session, source: Statement) -> set[str]:
    if source.invoice is not None:
        return set(billing_reads.line_gpus(session, source.invoice.id))
    return {line.gpu_uuid for line in source.to_date if line.gpu_uuid}


def _rental_regions(
    session: Session, customer: Customer, rental_ids: set[uuid.UUID]
) -> dict[uuid.UUID, str]:
    """Each rental's datacenter: where its GPU assignments spent the most seconds."""
    if not rental_ids:
        return {}
    rows = session.execute(served(customer_id=customer.id, rental_ids=rental_ids)).all()
    places = fleet_reads.gpu_places(session, {row[2] for row in rows})
    seconds: dict[uuid.UUID, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for rental_id, _, gpu, start, end in rows:
        if gpu in places:
            held = ((end or start) - start).total_seconds()
            seconds[rental_id][places[gpu][1]] += max(held, 1)
    return {rental: max(dcs, key=lambda dc: (dcs[dc], dc)) for rental, dcs in seconds.items()}


# --- values ---------------------------------------------------------------------------------


def _utc(t: int | datetime) -> str:
    moment = from_epoch(t) if isinstance(t, int) else t
    return moment.astimezone(ZoneInfo("UTC")).strftime("%Y-%m-%dT%H:%M:%SZ")


def decimal(value: Decimal | None) -> str:
    """A FOCUS Decimal: no trailing zeros past the second place, never an exponent, and
    always a point (a column of whole numbers would read as integers)."""
    if value is None:
        return ""
    exact = value.normalize()
    if exact.as_tuple().exponent > -2:  # type: ignore[operator]
        exact = exact.quantize(Decimal("0.01"))
    return f"{exact:f}"


def _hours(seconds: Decimal) -> Decimal:
    return (seconds / 3600).quantize(HOURS, ROUND_HALF_EVEN)


class _Cap:
    """Folds each rental's cap into its usage rows, streaming: the k-th row's share is the
    cumulative share rounded minus the rows' before it, so the shares sum to the cap exactly
    and each is within a minor unit of its proportional part."""

    def __init__(self, caps: Mapping[uuid.UUID, tuple[Decimal, Decimal]], currency: str) -> None:
        self._caps = caps
        self._step = Decimal(1).scaleb(-minor_units(currency))
        self._seen: dict[uuid.UUID, tuple[Decimal, Decimal]] = {}  # charged, capped so far

    def folds(self, rental_id: uuid.UUID | None) -> bool:
        return rental_id in self._caps

    def share(self, rental_id: uuid.UUID | None, amount: Decimal) -> Decimal:
        if rental_id is None or rental_id not in self._caps:
            return Decimal(0)
        cap, charged = self._caps[rental_id]
        before, capped = self._seen.get(rental_id, (Decimal(0), Decimal(0)))
        upto = (cap * (before + amount) / charged).quantize(self._step, ROUND_HALF_EVEN)
        self._seen[rental_id] = (before + amount, upto)
        return upto - capped


@dataclass
class _Totals:
    """Running sums of the rows before the tax row (its list and contracted cost follow them)."""

    listed: Decimal = Decimal(0)
    contracted: Decimal = Decimal(0)


def focus_csv(
    parts: Iterable[DayPart],
    source: Statement,
    customer: Customer,
    provider: str,
    book: Catalogue,
) -> Iterator[str]:
    period_start, period_end = (_utc(t) for t in source.period.span)
    step = Decimal(1).scaleb(-minor_units(source.currency))
    cap = _Cap(book.caps, source.currency)
    totals = _Totals()

    def row(p: DayPart) -> dict[str, str] | None:
        line, kind = p.line, LineKind(p.line.kind)
        if kind is LineKind.PREPAID_BALANCE:
            return None  # a payment, not a charge
        if kind is LineKind.CAP and cap.folds(line.rental_id):
            return None  # its share is on each of the rental's usage rows
        facts = book.rentals.get(line.rental_id) if line.rental_id else None
        amount = p.amount.quantize(step)
        reduction = cap.share(line.rental_id, amount) if kind is LineKind.CHARGE else None
        billed = amount + (reduction or 0)
        priced = kind in _PRICED and line.rate is not None and p.seconds is not None
        sku = facts and priced and book.list_price(facts, p.start)
        quantity = contracted_price = list_price = None
        if priced:
            assert p.seconds is not None and line.rate is not None
            quantity = _hours(p.seconds) * (-1 if kind in CREDIT_KINDS else 1)
            contracted_price = line.rate
            list_price = sku.price if sku else line.rate
        if kind is LineKind.TAX:
            rate = line.rate or Decimal(0)
            listed = (totals.listed * rate).quantize(step)
            contracted = (totals.contracted * rate).quantize(step)
        elif quantity is not None:
            assert list_price is not None and contracted_price is not None
            listed, contracted = list_price * quantity, contracted_price * quantity
        else:
            listed = contracted = billed
        totals.listed += listed
        totals.contracted += contracted
        usage = kind in (LineKind.CHARGE, LineKind.ADJUSTMENT)
        region = (line.gpu_uuid and book.gpu_regions.get(line.gpu_uuid)) or (
            facts.region if facts else None
        )
        rental = str(line.rental_id) if line.rental_id else ""
        details = (
            {"GpuCount": 1, "x_GpuModel": facts.gpu_model, "x_Preemptible": facts.preemptible}
            if sku and facts
            else None
        )
        return {
            "BilledCost": decimal(billed),
            "BillingAccountId": str(customer.id),
            "BillingAccountName": customer.name,
            "BillingCurrency": source.currency,
            "BillingPeriodEnd": period_end,
            "BillingPeriodStart": period_start,
            "ChargeCategory": "Credit" if kind in CREDIT_KINDS else _CATEGORY[kind],
            "ChargeClass": "Correction" if kind in _CORRECTIONS else "",
            "ChargeDescription": _DESCRIPTION.get(kind) or billing_wording.label(kind),
            "ChargeFrequency": "Usage-Based" if kind in _PRICED else "One-Time",
            "ChargePeriodEnd": _utc(p.end),
            "ChargePeriodStart": _utc(p.start),
            "ConsumedQuantity": f"{quantity:f}" if usage and quantity is not None else "",
            "ConsumedUnit": UNIT if usage and quantity is not None else "",
            "ContractedCost": decimal(contracted),
            "ContractedUnitPrice": decimal(contracted_price),
            "EffectiveCost": decimal(billed),
            "InvoiceId": source.invoice_id,
            "InvoiceIssuerName": provider,
            "ListCost": decimal(listed),
            "ListUnitPrice": decimal(list_price),
            "PricingCategory": "Standard" if priced else "",
            # Priced and billed in one currency: the pricing-currency columns repeat the
            # billing currency's (the spec allows them in all cases; its validator wants them).
            "PricingCurrency": source.currency,
            "PricingCurrencyContractedUnitPrice": decimal(contracted_price),
            "PricingCurrencyEffectiveCost": decimal(billed),
            "PricingCurrencyListUnitPrice": decimal(list_price),
            "PricingQuantity": "" if quantity is None else f"{quantity:f}",
            "PricingUnit": UNIT if quantity is not None else "",
            "ProviderName": provider,
            "PublisherName": provider,
            "RegionId": region or "",
            "RegionName": region or "",
            "ResourceId": rental,
            "ResourceName": (facts.name or "") if facts else "",
            "ResourceType": "GPU rental" if rental else "",
            "ServiceCategory": "Compute",
            "ServiceName": "GPU rental",
            "ServiceSubcategory": "Virtual Machines",
            "SkuId": (facts.gpu_model if facts else line.gpu_model or "") if sku else "",
            "SkuMeter": "GPU time" if sku else "",
            "SkuPriceDetails": json.dumps(details, separators=(",", ":")) if details else "",
            "SkuPriceId": sku.sku_price_id if sku else "",
            "SubAccountId": rental,
            # A rental of an earlier period no longer found has no label: its id.
            "SubAccountName": (facts.label if facts else rental) if rental else "",
            "x_LineKind": kind.value,
            "x_GpuSeconds": "" if p.seconds is None else f"{p.seconds.quantize(Decimal(1))}",
            "x_GpuUuid": line.gpu_uuid or "",
            "x_CapReduction": decimal(reduction) if reduction else "",
        }

    names = [c.name for c in FOCUS_COLUMNS]
    rows = (values for values in map(row, parts) if values is not None)
    numbers = {c.name for c in FOCUS_COLUMNS if c.type == "Decimal"}
    return csv_chunks(names, ([values[n] for n in names] for values in rows), numbers)
