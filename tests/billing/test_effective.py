from decimal import Decimal

from app.billing.domain import Assignment
from app.billing.effective import effective_usage_by_customer, idle_spans
from app.billing.rating import rate_rentals

from .factories import MONTH, failed, healthy, rental, usd_plan


def test_idle_minutes_are_strictly_below_the_threshold() -> None:
    assert idle_spans({0: 9, 60: 5, 120: 10, 300: 0}) == [(0, 120), (300, 360)]


def test_effective_hours_subtract_credits_and_idle_billable_seconds() -> None:
    plan = usd_plan()
    rentals = [rental(plan, "r1"), rental(plan, "r2")]
    assignments = [Assignment("r1", "A", 0, 7200), Assignment("r2", "B", 0, 3600)]
    segments = {"A": [healthy("A", 0, 7200), failed("A", 0, 600)], "B": [healthy("B", 0, 3600)]}
    rated = rate_rentals(rentals, assignments, segments, {}, [], MONTH)
    # Minutes 0-9 on A are failed (credited, not idle); 10-19 idle; B idle for 30 minutes.
    utilisation = {"A": {60 * m: 0 for m in range(20)}, "B": {60 * m: 3 for m in range(30)}}
    usage = effective_usage_by_customer(rated, utilisation)["c1"]
    assert (usage.rented_s, usage.credited_s, usage.idle_s) == (10800, 600, 600 + 1800)
    assert usage.effective_s == 7800
    assert usage.effective_gpu_hours == Decimal("2.166667")
