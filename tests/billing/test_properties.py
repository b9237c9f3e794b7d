"""Property tests over random assignments, segments, maintenance and migrations.

The oracle classifies second by second, which is fine at these tiny time scales.
"""

import itertools
from collections import Counter
from dataclasses import replace
from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from app.billing.core.domain import (
    CREDIT_BUCKETS,
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
from app.billing.core.lines import InvoiceLine, LineKind, sum_amounts
from app.billing.core.rating import RatedRental, is_billed, rate_rentals
from app.billing.core.vouchers import (
    EntryKind,
    apply_vouchers,
    balance,
    issue_voucher,
    open_vouchers,
)
from app.core.money import round_money, time_amount

GPUS = ("g0", "g1", "g2")
RENTALS = ("r0", "r1", "r2")
PERIOD = (10, 110)
times = st.integers(0, 120)
spans = st.tuples(times, times).map(sorted)
_SEVERITY = [GpuState.HEALTHY, GpuState.DEGRADED, GpuState.FAILED]
_STALLING = (Bucket.FAILURE_CREDIT, Bucket.MIGRATION_CREDIT)
_STALLABLE = (Bucket.BILLABLE, Bucket.DEGRADED)


@st.composite
def worlds(draw: st.DrawFn) -> dict:
    assignments = []
    for gpu in GPUS:  # assignments never overlap across rentals on one GPU
        cuts = sorted(draw(st.lists(times, max_size=6)))
        for start, end in itertools.pairwise(cuts):
            if (owner := draw(st.sampled_from((*RENTALS, None)))) and start < end:
                assignments.append(Assignment(owner, gpu, start, end))
    segments = [
        Segment(gpu, s, e, draw(st.sampled_from(_SEVERITY)), {"n": i})
        for i, (gpu, (s, e)) in enumerate(draw(st.lists(st.tuples(st.sampled_from(GPUS), spans))))
    ]
    migrations = [
        Migration(r, a, b, s, e, {"m": r})
        for r, a, b, (s, e) in draw(
            st.lists(
                st.tuples(*(st.sampled_from(x) for x in (RENTALS, GPUS, GPUS)), spans), max_size=3
            )
        )
        if a != b
    ]
    maintenance = {g: draw(st.lists(spans, max_size=2)) for g in GPUS}
    # A whole 100-s period at 3.60/h costs 0.10 per GPU: these caps bind, or do not.
    cap = draw(st.sampled_from((None, Decimal("0.01"), Decimal("0.05"), Decimal("1"))))
    plan = PlanTerms(
        prices=(
            PricePoint("H100", 0, Decimal("3.60"), cap),
            PricePoint("H100", 60, Decimal("7.20"), cap),
        ),
        increment_s=draw(st.sampled_from((1, 7, 60))),
        minimum_s=draw(st.sampled_from((0, 1, 10))),
        bill_degraded=draw(st.booleans()),
        bill_unmetered=draw(st.booleans()),
        credit_stall=draw(st.booleans()),
    )
    rentals = [
        RentalInput(r, "c1", "H100", 1, draw(times), draw(st.none() | times), plan) for r in RENTALS
    ]
    return {
        "rentals": rentals,
        "assignments": assignments,
        "segments_by_gpu": {g: [s for s in segments if s.gpu_uuid == g] for g in GPUS},
        "maintenance_by_gpu": maintenance,
        "migrations": migrations,
        "period": PERIOD,
    }


_CREDITS = frozenset(
    {
        LineKind.FAILURE_CREDIT,
        LineKind.MIGRATION_CREDIT,
        LineKind.DEGRADED_CREDIT,
        LineKind.STALL_CREDIT,
    }
)


def _rate(world: dict) -> list[RatedRental]:
    return rate_rentals(RatingInputs(**world))


def _oracle_bucket(world: dict, plan: PlanTerms, gpu: str, t: int) -> Bucket:
    if any(s <= t < e for s, e in world["maintenance_by_gpu"][gpu]):
        return Bucket.MAINTENANCE
    states = [s.state for s in world["segments_by_gpu"][gpu] if s.start <= t < s.end]
    if not states:
        return Bucket.UNMETERED
    worst = max(states, key=_SEVERITY.index)
    if worst is GpuState.FAILED:
        return Bucket.FAILURE_CREDIT
    if worst is GpuState.DEGRADED:
        return Bucket.DEGRADED if plan.bill_degraded else Bucket.DEGRADED_CREDIT
    return Bucket.BILLABLE


def _oracle(world: dict, rental: RentalInput) -> Counter:
    lo = max(PERIOD[0], rental.rental_start)
    hi = PERIOD[1] if rental.rental_end is None else min(PERIOD[1], rental.rental_end)
    mine = [a for a in world["assignments"] if a.rental_id == rental.rental_id]
    migrations = [m for m in world["migrations"] if m.rental_id == rental.rental_id]
    counts: Counter = Counter()
    for t in range(lo, hi):
        in_window = [m for m in migrations if m.failed_at <= t < m.resumed_at]
        second: dict[str, Bucket] = {}  # each GPU's bucket at t, stall aside
        for gpu in GPUS:
            if any(m.from_gpu == gpu for m in in_window):
                second[gpu] = Bucket.MIGRATION_CREDIT
            assigned = any(a.gpu_uuid == gpu and a.start <= t < a.end for a in mine)
            if assigned and not any(gpu in (m.from_gpu, m.to_gpu) for m in in_window):
                second[gpu] = _oracle_bucket(world, rental.plan, gpu, t)
        stopped = {g for g, b in second.items() if b in _STALLING}
        for gpu, bucket in second.items():
            if rental.plan.credit_stall and bucket in _STALLABLE and stopped - {gpu}:
                bucket = Bucket.STALL_CREDIT  # another GPU of the job failed or is migrating
            counts[bucket] += 1
    return counts


@settings(max_examples=300, deadline=None)
@given(worlds())
def test_buckets_match_the_per_second_oracle_and_sum_to_rented(world: dict) -> None:
    for rated in _rate(world):
        assert {b: n for b, n in rated.buckets.items() if n} == dict(_oracle(world, rated.rental))
        assert rated.rented_s == sum(p.seconds for p in rated.pieces)


def _billed_spans(rated: RatedRental) -> list[tuple[str, int, int]]:
    plan = rated.rental.plan
    return [(p.gpu_uuid, p.start, p.end) for p in rated.pieces if is_billed(p.bucket, plan)]


def _assert_disjoint(spans: list[tuple[str, int, int]]) -> None:
    ordered = sorted(spans)
    for (g1, _, e1), (g2, s2, _) in itertools.pairwise(ordered):
        assert g1 != g2 or e1 <= s2


@settings(max_examples=300, deadline=None)
@given(worlds())
def test_no_second_is_billed_twice(world: dict) -> None:
    rated = _rate(world)
    for r in rated:
        _assert_disjoint(_billed_spans(r))
    _assert_disjoint([span for r in rated for span in _billed_spans(r)])


def _seconds(lines: list[InvoiceLine]) -> int:
    """Total seconds of time lines (every charge and credit line carries its seconds)."""
    total = 0
    for line in lines:
        assert line.seconds is not None, line
        total += line.seconds
    return total


@settings(max_examples=300, deadline=None)
@given(worlds())
def test_credits_and_charges_are_consistent(world: dict) -> None:
    for rated in _rate(world):
        assert 0 <= rated.credited_s <= rated.rented_s
        credit_lines = [x for x in rated.lines if x.kind in _CREDITS]
        charge_lines = [x for x in rated.lines if x.kind is LineKind.CHARGE]
        assert _seconds(credit_lines) == rated.credited_s
        assert _seconds(charge_lines) == rated.billed_s + rated.credited_s
        assert all(x.amount <= 0 for x in credit_lines)
        assert sum(rated.buckets[b] for b in CREDIT_BUCKETS) == rated.credited_s
        plan = rated.rental.plan
        for s in rated.sessions:
            if s.billed_s == 0:
                assert s.charged_s == 0
            else:
                assert s.billed_s <= s.charged_s  # credited seconds count toward the minimum
                assert s.charged_s < s.billed_s + max(plan.increment_s, plan.minimum_s)


@settings(max_examples=200, deadline=None)
@given(worlds())
def test_rating_is_deterministic(world: dict) -> None:
    assert _rate(world) == _rate(world)


def _with_increment(world: dict, increment: int) -> dict:
    rentals = [replace(r, plan=replace(r.plan, increment_s=increment)) for r in world["rentals"]]
    return {**world, "rentals": rentals}


@settings(max_examples=200, deadline=None)
@given(worlds())
def test_coarser_increments_never_bill_less(world: dict) -> None:
    fine = _rate(_with_increment(world, 1))
    for increment in (60, 3600):
        for f, c in zip(fine, _rate(_with_increment(world, increment)), strict=True):
            assert c.billed_s >= f.billed_s
            assert c.net >= f.net


@settings(max_examples=300, deadline=None)
@given(worlds())
def test_net_is_billed_seconds_times_price_per_price_period(world: dict) -> None:
    """charge - credits = round((charged s - credited s) x price) in every price period, and
    each credit line is within one cent of its own seconds x price."""
    for rated in _rate(world):
        charges = [x for x in rated.lines if x.kind is LineKind.CHARGE]
        expected = Decimal("0.00")
        for charge in charges:
            assert charge.start is not None and charge.end is not None and charge.rate
            credits = [
                x
                for x in rated.lines
                if x.kind in _CREDITS and charge.start <= (x.start or 0) < charge.end
            ]
            billed_s = (charge.seconds or 0) - sum(x.seconds or 0 for x in credits)
            net = time_amount(billed_s, charge.rate, "USD")
            assert charge.amount + sum_amounts(credits, "USD") == net
            expected += net
            for x in credits:
                exact = Decimal(x.seconds or 0) * charge.rate / 3600
                assert abs(-x.amount - exact) < Decimal("0.01")
        assert rated.uncapped_net == expected


def _uncredited_s(rated: RatedRental) -> int:
    return rated.rented_s - rated.credited_s


@settings(max_examples=300, deadline=None)
@given(worlds())
def test_a_capped_rental_pays_at_most_its_prorated_cap(world: dict) -> None:
    """Net <= cap x (rented s not credited ÷ period s), rounded once."""
    period_s = PERIOD[1] - PERIOD[0]
    for rated in _rate(world):
        cap = rated.rental.plan.prices[0].monthly_cap_per_gpu
        if cap is None:
            assert rated.cap_allowance is None
            continue
        bound = round_money(cap * _uncredited_s(rated) / period_s, "USD")
        assert rated.net <= bound
        if rated.cap_allowance is None:  # nothing charged in a capped price period
            assert not rated.lines
            continue
        assert rated.net == min(rated.uncapped_net, rated.cap_allowance)


def _without_failures(world: dict) -> dict:
    segments = {
        gpu: [replace(s, state=GpuState.HEALTHY) if s.state is GpuState.FAILED else s for s in ss]
        for gpu, ss in world["segments_by_gpu"].items()
    }
    return {**world, "segments_by_gpu": segments}


@settings(max_examples=300, deadline=None)
@given(worlds())
def test_a_failure_credit_never_raises_what_a_rental_pays(world: dict) -> None:
    """Capped or not: the same world without its failures never costs less."""
    for with_credit, without in zip(_rate(world), _rate(_without_failures(world)), strict=True):
        assert with_credit.net <= without.net


@st.composite
def ledgers(draw: st.DrawFn) -> tuple[list, list[tuple[Decimal, int]]]:
    cents = st.integers(1, 10_000).map(lambda c: Decimal(c) / 100)
    vouchers = [
        issue_voucher(f"v{i}", "c1", amount, at, days, "manual", "")
        for i, (amount, at, days) in enumerate(
            draw(st.lists(st.tuples(cents, st.integers(0, 10), st.integers(1, 10)), max_size=6))
        )
    ]
    invoices = draw(st.lists(st.tuples(cents | st.just(Decimal("0.00")), st.integers(0, 12))))
    return vouchers, sorted(invoices, key=lambda x: x[1])


@settings(max_examples=300, deadline=None)
@given(ledgers())
def test_voucher_money_is_conserved(data: tuple[list, list[tuple[Decimal, int]]]) -> None:
    """Invoices finalized at their times: vouchers issued by then and valid then apply;
    expired ones are written off dated at their expiry, never in the future."""
    vouchers, invoices = data
    ledger: list = []
    issued = sum((e.amount for e in vouchers), Decimal(0))
    for n, (due, day) in enumerate(invoices):
        finalized_at = day * 86400
        ledger += [v for v in vouchers if v.at <= finalized_at and v not in ledger]
        valid = {v.voucher_id: v for v in vouchers if v.at <= finalized_at}
        applied, expired = apply_vouchers(open_vouchers(ledger), due, finalized_at, f"inv{n}")
        assert sum((a.amount for a in applied), Decimal(0)) <= due  # never a negative due
        for a in applied:
            assert valid[a.voucher_id].expires_at > finalized_at
        for x in expired:
            assert x.at == valid[x.voucher_id].expires_at <= finalized_at
        ledger += applied + expired
        assert all(v.remaining > 0 for v in open_vouchers(ledger))
    ledger += [v for v in vouchers if v not in ledger]
    used = sum((e.amount for e in ledger if e.kind is not EntryKind.ISSUED), Decimal(0))
    assert issued == used + balance(ledger)
    assert balance(ledger) == sum((v.remaining for v in open_vouchers(ledger)), Decimal(0))
