from decimal import Decimal

import pytest

from app.billing.core.domain import (
    Assignment,
    Bucket,
    GpuState,
    Migration,
    PlanTerms,
    PricePoint,
    RatingInputs,
    RentalInput,
    Segment,
)
from app.billing.core.lines import LineKind
from app.billing.core.rating import (
    RatedRental,
    classify_rentals,
    rate_pieces,
    rate_rental,
    rate_rentals,
    session_runs,
)

from .factories import DAY, MONTH, failed, healthy, rental, usd_plan

F = 10 * DAY  # GPU A fails on day 10
END = MONTH[1]


def _amounts(rated, kind: LineKind) -> list[Decimal]:
    return [line.amount for line in rated.lines if line.kind is kind]


def _failure_then_migration(a_end: int, b_start: int):
    """H100 at $2.49/h all month; A fails for 47 min, then a 30-s migration window to B."""
    assignments = [Assignment("r1", "A", 0, a_end), Assignment("r1", "B", b_start, END)]
    segments = {
        "A": [healthy("A", 0, F), failed("A", F, F + 7200, "xid79")],
        "B": [healthy("B", 0, END)],
    }
    migration = Migration("r1", "A", "B", F + 2820, F + 2850, {"event_id": "mig1"})
    return rate_rental(
        RatingInputs([rental(usd_plan())], assignments, segments, {}, [migration], MONTH)
    )


@pytest.mark.parametrize(
    ("a_end", "b_start"),
    [(F + 2820, F + 2850), (F + 2850, F + 2850), (F + 2820, F + 2820), (F + 2850, F + 2820)],
    ids=["gap", "old-tail", "new-head", "both-overlap"],
)
def test_47_minute_failure_with_30_s_migration(a_end: int, b_start: int) -> None:
    rated = _failure_then_migration(a_end, b_start)
    assert rated.buckets[Bucket.FAILURE_CREDIT] == 2820
    assert rated.buckets[Bucket.MIGRATION_CREDIT] == 30
    assert rated.buckets[Bucket.BILLABLE] == 30 * DAY - 2850
    assert rated.rented_s == 30 * DAY  # the window is rented whoever covers it, once
    assert _amounts(rated, LineKind.CHARGE) == [Decimal("1792.80")]  # 720 h x 2.49
    assert _amounts(rated, LineKind.FAILURE_CREDIT) == [Decimal("-1.95")]  # 1.9505
    assert _amounts(rated, LineKind.MIGRATION_CREDIT) == [Decimal("-0.02")]  # 0.02075
    assert rated.net == Decimal("1790.83")
    failure = next(x for x in rated.lines if x.kind is LineKind.FAILURE_CREDIT)
    assert (failure.gpu_uuid, failure.start, failure.seconds) == ("A", F, 2820)
    assert failure.evidence == {"event_id": "xid79", "xid": 79}
    migration = next(x for x in rated.lines if x.kind is LineKind.MIGRATION_CREDIT)
    assert migration.evidence == {"event_id": "mig1"}


def test_price_change_splits_charge_and_credit_lines() -> None:
    change = 15 * DAY
    plan = PlanTerms(
        prices=(PricePoint("H100", 0, Decimal("2.00")), PricePoint("H100", change, Decimal("2.50")))
    )
    segments = {"A": [healthy("A", 0, END), failed("A", change - 1800, change + 1800)]}
    rated = rate_rental(
        RatingInputs([rental(plan)], [Assignment("r1", "A", 0, END)], segments, {}, [], MONTH)
    )
    charges = [x for x in rated.lines if x.kind is LineKind.CHARGE]
    assert [(x.start, x.end, x.seconds, x.amount) for x in charges] == [
        (0, change, change, Decimal("720.00")),
        (change, END, END - change, Decimal("900.00")),
    ]
    assert _amounts(rated, LineKind.FAILURE_CREDIT) == [Decimal("-1.00"), Decimal("-1.25")]


def test_cap_binds_per_gpu_count() -> None:
    plan = usd_plan(cap="1000")
    assignments = [Assignment("r1", "A", 0, END), Assignment("r1", "B", 0, END)]
    segments = {"A": [healthy("A", 0, END)], "B": [healthy("B", 0, END)]}
    rated = rate_rental(RatingInputs([rental(plan, gpus=2)], assignments, segments, {}, [], MONTH))
    assert _amounts(rated, LineKind.CHARGE) == [Decimal("3585.60")]
    assert _amounts(rated, LineKind.CAP) == [Decimal("-1585.60")]
    assert rated.net == Decimal("2000.00")


def test_cap_that_does_not_bind_adds_no_line() -> None:
    plan = usd_plan(cap="1792.80")
    segments = {"A": [healthy("A", 0, END)]}
    rated = rate_rental(
        RatingInputs([rental(plan)], [Assignment("r1", "A", 0, END)], segments, {}, [], MONTH)
    )
    assert _amounts(rated, LineKind.CAP) == []


@pytest.mark.parametrize(
    ("increment", "minimum", "charged"),
    [(1, 1, 61), (60, 1, 120), (3600, 1, 3600), (60, 300, 300), (60, 0, 120)],
)
def test_increments_and_minimums_per_session(increment: int, minimum: int, charged: int) -> None:
    plan = usd_plan("36.00", increment_s=increment, minimum_s=minimum)  # 0.01 $/s
    segments = {"A": [healthy("A", 0, 61)]}
    rated = rate_rental(
        RatingInputs([rental(plan)], [Assignment("r1", "A", 0, 61)], segments, {}, [], MONTH)
    )
    assert [s.charged_s for s in rated.sessions] == [charged]
    assert _amounts(rated, LineKind.CHARGE) == [Decimal(charged) / 100]


def test_each_session_is_rounded_separately() -> None:
    plan = usd_plan("3.60", increment_s=60)
    assignments = [Assignment("r1", "A", 0, 10), Assignment("r1", "A", 100, 110)]
    segments = {"A": [healthy("A", 0, 200)]}
    rated = rate_rental(RatingInputs([rental(plan)], assignments, segments, {}, [], MONTH))
    assert [s.charged_s for s in rated.sessions] == [60, 60]
    assert rated.billed_s == 120


def test_session_without_billed_seconds_costs_no_minimum() -> None:
    plan = usd_plan("3.60", increment_s=3600, minimum_s=600)
    segments = {"A": [failed("A", 0, 100)]}
    rated = rate_rental(
        RatingInputs([rental(plan)], [Assignment("r1", "A", 0, 100)], segments, {}, [], MONTH)
    )
    assert rated.sessions[0].charged_s == 0
    assert _amounts(rated, LineKind.CHARGE) == [Decimal("0.10")]
    assert _amounts(rated, LineKind.FAILURE_CREDIT) == [Decimal("-0.10")]
    assert rated.net == Decimal("0.00")


def _cheap_then_dear(change_at: int) -> PlanTerms:
    return PlanTerms(
        prices=(
            PricePoint("H100", 0, Decimal("3.60")),  # 0.001 $/s
            PricePoint("H100", change_at, Decimal("7.20")),
        ),
        increment_s=60,
    )


def test_rounding_extra_is_priced_at_the_sessions_last_billed_or_credited_second() -> None:
    segments = {"A": [healthy("A", 50, 161)]}
    rated = rate_rental(
        RatingInputs(
            [rental(_cheap_then_dear(100))],
            [Assignment("r1", "A", 50, 161)],
            segments,
            {},
            [],
            MONTH,
        )
    )
    charges = [(x.seconds, x.amount) for x in rated.lines if x.kind is LineKind.CHARGE]
    assert charges == [(50, Decimal("0.05")), (61 + 9, Decimal("0.14"))]


@pytest.mark.parametrize(("fails", "net"), [(False, "0.07"), (True, "0.06")])
def test_a_credit_in_a_cheap_price_period_does_not_come_back_as_dearer_rounding(
    fails: bool, net: str
) -> None:
    """Session [10, 61), the price doubles at 60. Rounding billed seconds alone, the 8 failed
    seconds at 0.001 $/s came back as 8 more seconds of rounding at 0.002 $/s (0.08 > 0.07)."""
    head = failed("A", 10, 18) if fails else healthy("A", 10, 18)
    segments = {"A": [head, healthy("A", 18, 61)]}
    rated = rate_rental(
        RatingInputs(
            [rental(_cheap_then_dear(60))], [Assignment("r1", "A", 10, 61)], segments, {}, [], MONTH
        )
    )
    charges = [(x.seconds, x.amount) for x in rated.lines if x.kind is LineKind.CHARGE]
    assert charges == [(50, Decimal("0.05")), (1 + 9, Decimal("0.02"))]  # 51 s rounds up by 9
    assert _amounts(rated, LineKind.FAILURE_CREDIT) == ([Decimal("-0.01")] if fails else [])
    assert rated.net == Decimal(net)
    assert [s.charged_s for s in rated.sessions] == [(43 if fails else 51) + 9]


def test_maintenance_unmetered_and_degraded_rules() -> None:
    segments = {
        "A": [
            healthy("A", 0, 100),
            Segment("A", 100, 200, GpuState.DEGRADED, {"event_id": "d1"}),
            failed("A", 250, 300),
        ]
    }
    maintenance = {"A": [(50, 80), (260, 270)]}  # maintenance outranks failed
    assignments = [Assignment("r1", "A", 0, 400)]
    base = rental(usd_plan("3.60"))
    rated = rate_rental(RatingInputs([base], assignments, segments, maintenance, [], MONTH))
    assert rated.buckets == {
        Bucket.MIGRATION_CREDIT: 0,
        Bucket.MAINTENANCE: 40,
        Bucket.FAILURE_CREDIT: 40,
        Bucket.UNMETERED: 150,
        Bucket.STALL_CREDIT: 0,
        Bucket.DEGRADED: 100,
        Bucket.DEGRADED_CREDIT: 0,
        Bucket.BILLABLE: 70,
    }
    assert rated.billed_s == 170
    strict = usd_plan("3.60", bill_degraded=False, bill_unmetered=True)
    rated = rate_rental(
        RatingInputs([rental(strict)], assignments, segments, maintenance, [], MONTH)
    )
    assert rated.buckets[Bucket.DEGRADED_CREDIT] == 100
    assert rated.billed_s == 70 + 150
    assert _amounts(rated, LineKind.DEGRADED_CREDIT) == [Decimal("-0.10")]
    assert _amounts(rated, LineKind.CHARGE) == [Decimal("0.36")]  # 220 + 100 + 40 s


def test_rental_bounds_and_period_clip_assignments() -> None:
    segments = {"A": [healthy("A", -DAY, END + DAY)]}
    assignments = [Assignment("r1", "A", -DAY, END + DAY)]
    late = rental(usd_plan(), rental_start=DAY, rental_end=2 * DAY)
    rated = rate_rental(RatingInputs([late], assignments, segments, {}, [], MONTH))
    assert rated.rented_s == DAY
    assert _amounts(rated, LineKind.CHARGE) == [Decimal("59.76")]


def test_missing_price_is_an_error() -> None:
    plan = PlanTerms(prices=(PricePoint("H100", 100, Decimal("1")),))
    with pytest.raises(ValueError, match="no price"):
        segments = {"A": [healthy("A", 0, 200)]}
        rate_rental(
            RatingInputs([rental(plan)], [Assignment("r1", "A", 0, 200)], segments, {}, [], MONTH)
        )


def test_net_is_billable_seconds_times_price_not_the_sum_of_rounded_credits() -> None:
    """2 h at 2.80/h, a 47-min failure and a 30-s migration: 4,350 billable s -> 3.38.

    Rounded on their own the credits were 2.19 + 0.02 and the net 3.39. Exact, they are
    2.19333 and 0.02333: the 2.22 the net needs goes 2.20 + 0.02 (equal remainders: the
    earlier incident takes the cent)."""
    start, fail = 0, 1000
    plan = usd_plan("2.80")
    assignments = [Assignment("r1", "A", 0, fail + 2820), Assignment("r1", "B", fail + 2850, 7200)]
    segments = {
        "A": [healthy("A", 0, fail), failed("A", fail, fail + 2820)],
        "B": [healthy("B", 0, 7200)],
    }
    migration = Migration("r1", "A", "B", fail + 2820, fail + 2850)
    two_hours = rental(plan, rental_start=start, rental_end=7200)
    rated = rate_rental(RatingInputs([two_hours], assignments, segments, {}, [migration], MONTH))
    assert rated.buckets[Bucket.BILLABLE] == 4350
    assert [(x.kind, x.seconds, x.amount) for x in rated.lines] == [
        (LineKind.CHARGE, 7200, Decimal("5.60")),
        (LineKind.FAILURE_CREDIT, 2820, Decimal("-2.20")),
        (LineKind.MIGRATION_CREDIT, 30, Decimal("-0.02")),
    ]
    assert rated.net == Decimal("3.38")


def _capped_month(plan: PlanTerms) -> RatedRental:
    segments = {"A": [healthy("A", 0, F), failed("A", F, F + 2820)], "B": [healthy("B", 0, END)]}
    assignments = [Assignment("r1", "A", 0, F + 2820), Assignment("r1", "B", F + 2850, END)]
    migration = Migration("r1", "A", "B", F + 2820, F + 2850)
    return rate_rental(RatingInputs([rental(plan)], assignments, segments, {}, [migration], MONTH))


def test_a_credit_lowers_what_a_capped_rental_pays() -> None:
    """Cap 1500/GPU-month, 1792.80 of GPU time: the failure's 2,850 credited seconds earn no
    allowance: 1500 x 2,589,150 / 2,592,000 = 1498.3507 -> 1498.35 (not 1500.00)."""
    rated = _capped_month(usd_plan(cap="1500"))
    assert [(x.kind, x.amount) for x in rated.lines] == [
        (LineKind.CHARGE, Decimal("1792.80")),
        (LineKind.FAILURE_CREDIT, Decimal("-1.95")),
        (LineKind.MIGRATION_CREDIT, Decimal("-0.02")),
        (LineKind.CAP, Decimal("-292.48")),
    ]
    assert rated.net == rated.cap_allowance == Decimal("1498.35")
    cap = rated.lines[-1]
    assert cap.evidence == {
        "allowance": "1498.35",
        "capped_net": "1790.83",
        "period_s": 30 * DAY,
        "caps_per_gpu": ["1500"],
    }


def test_the_cap_is_prorated_by_the_part_of_the_period_rented() -> None:
    """Half the month: the allowance is half the cap (750.00); 15 d x 24 h x 2.49 = 896.40."""
    segments = {"A": [healthy("A", 0, END)]}
    half = rental(usd_plan(cap="1500"), rental_end=15 * DAY)
    rated = rate_rental(
        RatingInputs([half], [Assignment("r1", "A", 0, END)], segments, {}, [], MONTH)
    )
    assert _amounts(rated, LineKind.CHARGE) == [Decimal("896.40")]
    assert rated.net == Decimal("750.00")


def test_caps_belong_to_each_model_and_are_effective_dated_with_its_price() -> None:
    """H100 cap 1500 until day 15, 1200 after; an A100 has its own cap, 900."""
    plan = PlanTerms(
        prices=(
            PricePoint("H100", 0, Decimal("2.49"), Decimal("1500")),
            PricePoint("H100", 15 * DAY, Decimal("2.49"), Decimal("1200")),
            PricePoint("A100", 0, Decimal("1.59"), Decimal("900")),
        )
    )
    segments = {"A": [healthy("A", 0, END)]}
    h100 = rate_rental(
        RatingInputs([rental(plan)], [Assignment("r1", "A", 0, END)], segments, {}, [], MONTH)
    )
    assert h100.net == Decimal("1350.00")  # 1500 / 2 + 1200 / 2
    a100 = RentalInput("r2", "c1", "A100", 1, 0, None, plan)
    rated = rate_rental(
        RatingInputs([a100], [Assignment("r2", "A", 0, END)], segments, {}, [], MONTH)
    )
    assert _amounts(rated, LineKind.CHARGE) == [Decimal("1144.80")]  # 720 h x 1.59
    assert rated.net == Decimal("900.00")


def _stalled_job(credit_stall: bool = True) -> list[RatedRental]:
    """A 4-GPU job at $3.60/h for a day (A, B, C, D) beside a 1-GPU rental on E: A fails at
    F and the job resumes on spare S 2850 s later (47 min failed, then a 30-s migration); D
    is degraded meanwhile, C has no telemetry for 60 s of it; E's own rental runs on."""
    plan = usd_plan("3.60", credit_stall=credit_stall)
    job = rental(plan, "r1", gpus=4, rental_end=F + DAY)
    other = rental(plan, "r2", rental_end=F + DAY)
    assignments = [
        Assignment("r1", "A", 0, F + 2820),
        Assignment("r1", "S", F + 2850, F + DAY),
        *(Assignment("r1", g, 0, F + DAY) for g in "BCD"),
        Assignment("r2", "E", 0, F + DAY),
    ]
    segments = {
        "A": [healthy("A", 0, F), failed("A", F, F + DAY, "xid79")],
        "B": [healthy("B", 0, F + DAY)],
        "C": [healthy("C", 0, F + 100), healthy("C", F + 160, F + DAY)],
        "D": [
            healthy("D", 0, F - 50),
            Segment("D", F - 50, F + 3000, GpuState.DEGRADED, {"event_id": "d1"}),
            healthy("D", F + 3000, F + DAY),
        ],
        "E": [healthy("E", 0, F + DAY)],
        "S": [healthy("S", 0, F + DAY)],
    }
    migration = Migration("r1", "A", "S", F + 2820, F + 2850, {"reason": "failover f1"})
    inputs = RatingInputs([job, other], assignments, segments, {}, [migration], MONTH)
    return rate_rentals(inputs)


def test_a_failure_stalls_the_whole_job_until_it_resumes_on_the_spare() -> None:
    job, other = _stalled_job()
    # B, C and D wait 2850 s each (C's 60 unmetered seconds stay unmetered); D's degraded
    # seconds before the failure stay billed.
    assert job.buckets[Bucket.STALL_CREDIT] == 3 * 2850 - 60
    assert job.buckets[Bucket.UNMETERED] == 60
    assert job.buckets[Bucket.DEGRADED] == 50 + (3000 - 2850)
    assert job.rented_s == 4 * (F + DAY)
    stalls = [x for x in job.lines if x.kind is LineKind.STALL_CREDIT]
    # One line per stalled run: the failure and the migration window after it are one stall.
    assert [(x.gpu_uuid, x.start, x.seconds) for x in stalls] == [
        ("B", F, 2850),
        ("C", F, 100),
        ("C", F + 160, 2690),
        ("D", F, 2850),
    ]
    evidence = {"stalled_by": "A", "bucket": "failure_credit", "event_id": "xid79", "xid": 79}
    assert all(x.evidence == evidence for x in stalls)
    # $3.60/h is $0.001 a second: every line is exact.
    assert [x.amount for x in stalls] == [Decimal(v) for v in ("-2.85", "-0.10", "-2.69", "-2.85")]
    billed_s = job.buckets[Bucket.BILLABLE] + job.buckets[Bucket.DEGRADED]
    assert job.net == Decimal(billed_s) / 1000  # $3.60/h is $0.001 a second
    assert other.buckets[Bucket.STALL_CREDIT] == 0  # another rental's job is not stalled


def test_a_plan_without_stall_credit_bills_the_other_gpus() -> None:
    job, _ = _stalled_job(credit_stall=False)
    assert job.buckets[Bucket.STALL_CREDIT] == 0
    assert not [x for x in job.lines if x.kind is LineKind.STALL_CREDIT]
    assert job.buckets[Bucket.BILLABLE] + job.buckets[Bucket.DEGRADED] == 4 * (F + DAY) - 2850 - 60


def test_pieces_read_back_rate_a_migration_window_outside_every_session_as_live() -> None:
    """Rollups hand ``rate_pieces`` their stored pieces, which no longer say which session they
    came from: a migration window in the old GPU's run must stay out of its rounding there too.
    A 5-s window at the end of an hour on A, at a 7-s increment: A's 3,600 billed seconds round
    to 3,605 on their own (515 x 7), not to 3,600 (the 3,605 with the window's 5 s rounded
    in, less the 5 s)."""
    assignments = [Assignment("r1", "A", 0, 3605), Assignment("r1", "B", 3605, 7200)]
    segments = {"A": [healthy("A", 0, 3605)], "B": [healthy("B", 3605, 7200)]}
    window = Migration("r1", "A", "B", 3600, 3605)
    inputs = RatingInputs(
        [rental(usd_plan("3.60", increment_s=7), rental_end=7200)],
        assignments,
        segments,
        {},
        [window],
        MONTH,
    )
    live = rate_rental(inputs)
    [classified] = classify_rentals(inputs)
    runs = session_runs(assignments, classified.bounds)
    read_back = rate_pieces(
        classified.rental, classified.bounds, classified.pieces, runs, MONTH[1] - MONTH[0]
    )
    assert [(s.gpu_uuid, s.billed_s, s.charged_s) for s in live.sessions] == [
        ("A", 3600, 3605),
        ("B", 3595, 3598),
    ]
    assert read_back.sessions == live.sessions
    assert read_back.lines == live.lines
