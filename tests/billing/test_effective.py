from decimal import Decimal

from app.billing.core.domain import Assignment, RatingInputs
from app.billing.core.effective import EffectiveUsage, effective_usage, minute_spans
from app.billing.core.rating import rate_rentals

from .factories import MONTH, failed, healthy, rental, usd_plan


def test_idle_minutes_merge_into_spans() -> None:
    # Which minutes are idle (strictly below the threshold) is metering's rule and test.
    assert minute_spans([0, 60, 300]) == [(0, 120), (300, 360)]


def test_effective_hours_subtract_credits_and_idle_billable_seconds() -> None:
    plan = usd_plan()
    rentals = [rental(plan, "r1"), rental(plan, "r2")]
    assignments = [Assignment("r1", "A", 0, 7200), Assignment("r2", "B", 0, 3600)]
    segments = {"A": [healthy("A", 0, 7200), failed("A", 0, 600)], "B": [healthy("B", 0, 3600)]}
    rated = rate_rentals(RatingInputs(rentals, assignments, segments, {}, [], MONTH))
    # Minutes 0-9 on A are failed (credited, not idle); 10-19 idle; B idle for 30 minutes.
    idle = {"A": minute_spans(range(0, 20 * 60, 60)), "B": minute_spans(range(0, 30 * 60, 60))}
    usage = sum((effective_usage(r, idle) for r in rated), EffectiveUsage(0, 0, 0))
    assert (usage.rented_s, usage.credited_s, usage.idle_s) == (10800, 600, 600 + 1800)
    assert usage.effective_s == 7800
    assert usage.effective_gpu_hours == Decimal("2.166667")


def test_unmetered_and_maintenance_seconds_are_not_effective() -> None:
    plan = usd_plan()
    # One hour rented; telemetry covers only the first 40 minutes.
    rated = rate_rentals(
        RatingInputs(
            [rental(plan, "r1")],
            [Assignment("r1", "A", 0, 3600)],
            {"A": [healthy("A", 0, 2400)]},
            {},
            [],
            MONTH,
        )
    )
    usage = effective_usage(rated[0], {})
    assert (usage.rented_s, usage.unmeasured_s, usage.effective_s) == (3600, 1200, 2400)
