"""Small builders shared by the billing tests (plain functions: no fixtures, no DB)."""

from decimal import Decimal

from app.billing.core.domain import GpuState, PlanTerms, PricePoint, RentalInput, Segment

DAY = 86400
MONTH = (0, 30 * DAY)  # a 30-day billing period starting at epoch 0


def usd_plan(price: str = "2.49", cap: str | None = None, **terms: object) -> PlanTerms:
    """A plan with one H100 price from epoch 0 and, with ``cap``, its monthly cap per GPU."""
    point = PricePoint("H100", 0, Decimal(price), None if cap is None else Decimal(cap))
    return PlanTerms(prices=(point,), **terms)  # type: ignore[arg-type]


def rental(plan: PlanTerms, rental_id: str = "r1", gpus: int = 1, **kw: object) -> RentalInput:
    fields: dict = {"rental_start": MONTH[0], "rental_end": None, **kw}
    return RentalInput(rental_id, "c1", "H100", gpus, plan=plan, **fields)


def healthy(gpu: str, start: int, end: int) -> Segment:
    return Segment(gpu, start, end, GpuState.HEALTHY)


def failed(gpu: str, start: int, end: int, event_id: str = "ev1") -> Segment:
    return Segment(gpu, start, end, GpuState.FAILED, {"event_id": event_id, "xid": 79})
