"""Rollups: the period to date from stored closed days and hours plus the live rest equals
rating the whole span, for arbitrary histories and moments, also after late data changes a
stored day or hour, and after a day that closed replaces its stored hours.

The worlds are ``test_properties``' (three GPUs, three rentals, segments, maintenance,
migrations, two prices, caps, increments), stretched so one time unit is an hour: the period
(about four days) then has local days, a price change inside one of them, and sessions,
failures and migration windows that cross midnight. Stored days go through Postgres (the
``usage_rollups`` tables, their SQL sums), the rest is the pure core.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from decimal import Decimal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from app.billing import rollups
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
from app.billing.core.effective import effective_usage
from app.billing.core.intervals import Span, clip, merge
from app.billing.core.rating import RatedRental, rate_rentals
from app.billing.core.whatif import DEFAULT_INCREMENTS, what_if, what_if_rated
from app.billing.loader import BillingPeriod, PeriodInputs
from app.core.db import transaction
from app.customers.schemas import CustomerCreate
from app.customers.service import create_customer
from tests.billing.test_properties import GPUS, PERIOD, worlds
from tests.harness import wait_for

H = 3600
SPAN = (0, (PERIOD[1] - PERIOD[0]) * H)  # 100 h from a UTC midnight
BILLING = BillingPeriod("1970-01", "UTC", SPAN)


def _t(t: int) -> int:
    return (t - PERIOD[0]) * H


def _stretch(world: dict, ids: dict[str, str]) -> dict:
    """The world with hours for time units, caps to match, and UUIDs for rental ids."""

    def plan(p: PlanTerms) -> PlanTerms:
        points = tuple(
            replace(
                x,
                effective_from=_t(x.effective_from),
                monthly_cap_per_gpu=None
                if x.monthly_cap_per_gpu is None
                else x.monthly_cap_per_gpu * H,
            )
            for x in p.prices
        )
        return replace(p, prices=points)

    return {
        "rentals": [
            replace(
                r,
                rental_id=ids[r.rental_id],
                rental_start=_t(r.rental_start),
                rental_end=None if r.rental_end is None else _t(r.rental_end),
                plan=plan(r.plan),
            )
            for r in world["rentals"]
        ],
        "assignments": [
            Assignment(ids[a.rental_id], a.gpu_uuid, _t(a.start), _t(a.end))
            for a in world["assignments"]
        ],
        "segments_by_gpu": {
            g: [replace(s, start=_t(s.start), end=_t(s.end)) for s in segs]
            for g, segs in world["segments_by_gpu"].items()
        },
        "maintenance_by_gpu": {
            g: [(_t(a), _t(b)) for a, b in spans]
            for g, spans in world["maintenance_by_gpu"].items()
        },
        "migrations": [
            Migration(ids[m.rental_id], m.from_gpu, m.to_gpu, _t(m.failed_at), _t(m.resumed_at))
            for m in world["migrations"]
        ],
    }


def _inputs(world: dict, customer: uuid.UUID, span: Span) -> PeriodInputs:
    """What ``load_inputs`` would give for ``span``: segments clipped to it."""
    segments = {
        g: [replace(s, start=c[0], end=c[1]) for s in segs if (c := clip((s.start, s.end), span))]
        for g, segs in world["segments_by_gpu"].items()
    }
    return PeriodInputs(
        span,
        rentals_of={customer: world["rentals"]},
        assignments=world["assignments"],
        segments_by_gpu=segments,
        maintenance_by_gpu=world["maintenance_by_gpu"],
        migrations=world["migrations"],
        assignments_by_customer={customer: world["assignments"]},
        migrations_by_customer={customer: world["migrations"]},
    )


def _idle_reader(idle: dict[str, list[Span]]) -> rollups.IdleReader:
    def read(gpus: Sequence[str], span: Span) -> dict[str, list[Span]]:
        return {g: [c for s in idle.get(g, []) if (c := clip(s, span))] for g in gpus}

    return read


def _rated(world: dict, as_of: int) -> list[RatedRental]:
    return rate_rentals(RatingInputs(**world, period=(SPAN[0], as_of)), cap_period=SPAN)


def _summary(r: RatedRental, idle_s: int) -> tuple:
    return (
        r.rental.rental_id,
        {b: s for b, s in r.buckets.items() if s},
        r.billed_s,
        r.credited_s,
        r.net,
        r.uncapped_net,
        r.cap_allowance,
        idle_s,
    )


@pytest.fixture
def customer(db: Engine) -> uuid.UUID:
    with transaction(db) as session:
        return create_customer(session, CustomerCreate(name="Rollups")).id


hours = st.integers(1, (PERIOD[1] - PERIOD[0]) * H)
idle_spans = st.dictionaries(
    st.sampled_from(GPUS),
    st.lists(
        st.tuples(st.integers(0, 100), st.integers(1, 30)).map(
            lambda x: (x[0] * H, (x[0] + x[1]) * H)
        ),
        max_size=3,
    ),
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    world=worlds(),
    late=st.lists(
        st.tuples(st.sampled_from(GPUS), st.integers(0, 60), st.integers(1, 20), st.booleans()),
        min_size=1,
        max_size=2,
    ),
    first=st.integers(48 * H, SPAN[1]),  # two days or more stored before the late data
    later=hours,
    idle=idle_spans,
)
def test_rollups_plus_the_live_rest_equal_rating_the_span(
    db: Engine,
    customer: uuid.UUID,
    world: dict,
    late: list[tuple[str, int, int, bool]],
    first: int,
    later: int,
    idle: dict[str, list[Span]],
) -> None:
    ids = {r: str(uuid.uuid4()) for r in ("r0", "r1", "r2")}
    world = _stretch(world, ids)
    # Idle minutes come merged and disjoint (``minute_spans``), as overlap counting expects.
    read_idle = _idle_reader({g: merge(spans) for g, spans in idle.items()})
    later = max(first, later)
    with Session(db) as session:  # rolled back at the end: each example starts empty
        # A first read stores the days closed by then ...
        rollups.rated_to_date(
            session, customer, BILLING, first, _inputs(world, customer, (0, first)), read_idle
        )
        # ... then late telemetry creates segments in them (failed or healthy).
        for gpu, at, length, failed in late:
            state = GpuState.FAILED if failed else GpuState.HEALTHY
            segments = [
                *world["segments_by_gpu"][gpu],
                Segment(gpu, at * H, (at + length) * H, state),
            ]
            world["segments_by_gpu"][gpu] = sorted(segments, key=lambda x: x.start)
        to_date = rollups.rated_to_date(
            session, customer, BILLING, later, _inputs(world, customer, (0, later)), read_idle
        )
        session.rollback()
    expected = _rated(world, later)
    idle_of = read_idle(list(GPUS), (0, later))
    assert [_summary(r, to_date.idle_s[r.rental.rental_id]) for r in to_date.rated] == [
        _summary(r, effective_usage(r, idle_of).idle_s) for r in expected
    ]
    whole = what_if(
        RatingInputs(
            world["rentals"],
            world["assignments"],
            world["segments_by_gpu"],
            world["maintenance_by_gpu"],
            world["migrations"],
            (0, later),
        ),
        cap_period=SPAN,
    )
    from_rollups = what_if_rated({i: to_date.rerated(i) for i in DEFAULT_INCREMENTS})
    assert from_rollups.rows == whole.rows


@settings(
    max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(world=worlds())
def test_the_live_idle_is_read_only_when_something_shows_it(
    db: Engine, customer: uuid.UUID, world: dict
) -> None:
    world = _stretch(world, {r: str(uuid.uuid4()) for r in ("r0", "r1", "r2")})
    reads: list[Span] = []

    def read_idle(gpus: Sequence[str], span: Span) -> dict[str, list[Span]]:
        reads.append(span)
        return {}

    as_of = SPAN[1] - 5 * H + H // 2  # three closed days, the open one at 23:30
    with Session(db) as session:
        inputs = _inputs(world, customer, (0, as_of))
        to_date = rollups.rated_to_date(session, customer, BILLING, as_of, inputs, read_idle)
        session.rollback()
    # Storing the closed days and the open day's closed hours reads theirs: rollups keep it.
    stored = list(reads)
    assert stored and all(end <= 95 * H for _, end in stored)
    to_date.rerated(60)  # the what-if: no idle read
    assert reads == stored
    assert set(to_date.idle_s) == {r.rental.rental_id for r in to_date.rated}
    assert reads == [*stored, (95 * H, as_of)]  # the usage API's idle: the live half hour's


def _steady_world() -> dict:
    """One rental on g0 for the whole span, healthy throughout but for a failed hour on day 1:
    every item covers day 2 and each of its hours whole, so only a span's end tells an hour of
    day 2 from the day."""
    plan = PlanTerms(prices=(PricePoint("H100", 0, Decimal("3.60"), None),), increment_s=60)
    world = {
        "rentals": [RentalInput("r0", "c1", "H100", 1, PERIOD[0], None, plan)],
        "assignments": [Assignment("r0", "g0", PERIOD[0], PERIOD[1])],
        "segments_by_gpu": {
            "g0": [
                Segment("g0", PERIOD[0], PERIOD[0] + 30, GpuState.HEALTHY),
                Segment("g0", PERIOD[0] + 30, PERIOD[0] + 31, GpuState.FAILED),
                Segment("g0", PERIOD[0] + 31, PERIOD[1], GpuState.HEALTHY),
            ]
        },
        "maintenance_by_gpu": {},
        "migrations": [],
    }
    return _stretch(world, {"r0": str(uuid.uuid4())})


def test_the_open_span_grows_by_the_hour_and_its_day_replaces_it(
    db: Engine, customer: uuid.UUID
) -> None:
    world = _steady_world()
    reads: list[Span] = []

    def read_idle(gpus: Sequence[str], span: Span) -> dict[str, list[Span]]:
        reads.append(span)
        return {"g0": [(49 * H, 49 * H + 600)]}  # ten idle minutes on day 2

    def read(session: Session, as_of: int) -> rollups.ToDate:
        reads.clear()
        inputs = _inputs(world, customer, (0, as_of))
        return rollups.rated_to_date(session, customer, BILLING, as_of, inputs, read_idle)

    def expected(as_of: int) -> list[tuple]:
        idle = {"g0": [x for s in [(49 * H, 49 * H + 600)] if (x := clip(s, (0, as_of)))]}
        return [_summary(r, effective_usage(r, idle).idle_s) for r in _rated(world, as_of)]

    with Session(db) as session:
        read(session, 50 * H + 600)  # days 0 and 1, and day 2 to 02:00
        assert reads == [(0, 50 * H)]
        to_date = read(session, 52 * H + 600)
        assert reads == [(48 * H, 52 * H)]  # only the open span is rated again: day 2 to 04:00
        assert [_summary(r, to_date.idle_s[r.rental.rental_id]) for r in to_date.rated] == (
            expected(52 * H + 600)
        )
        to_date = read(session, 73 * H)  # day 2 closed: rated whole, replacing its open span
        assert reads[0] == (48 * H, 72 * H)
        assert [_summary(r, to_date.idle_s[r.rental.rental_id]) for r in to_date.rated] == (
            expected(73 * H)
        )
        by_day = {(p.day, p.bucket): p.seconds for p in to_date.by_day}
        assert by_day == {
            (0, Bucket.BILLABLE): 24 * H,
            (1, Bucket.BILLABLE): 23 * H,
            (1, Bucket.FAILURE_CREDIT): H,
            (2, Bucket.BILLABLE): 24 * H,
            (3, Bucket.BILLABLE): H,
        }
        session.rollback()


def test_readers_queued_behind_the_one_storing_a_span_find_it_stored(
    db: Engine, customer: uuid.UUID
) -> None:
    world, as_of = _steady_world(), 50 * H + 600
    inputs = _inputs(world, customer, (0, as_of))
    first_reads: list[Span] = []
    second_reads: list[Span] = []

    def reader(reads: list[Span]) -> rollups.IdleReader:
        def read_idle(gpus: Sequence[str], span: Span) -> dict[str, list[Span]]:
            reads.append(span)
            return {}

        return read_idle

    def waiting_on_the_lock() -> bool:
        with db.connect() as connection:
            return bool(
                connection.scalar(
                    text(
                        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                    )
                )
            )

    with Session(db) as first:
        rollups.rated_to_date(first, customer, BILLING, as_of, inputs, reader(first_reads))
        assert first_reads == [(0, 50 * H)]  # stored, the lock held until it commits

        def second_read() -> None:
            with Session(db) as second:
                rollups.rated_to_date(
                    second, customer, BILLING, as_of, inputs, reader(second_reads)
                )
                second.commit()

        with ThreadPoolExecutor(1) as pool:
            queued = pool.submit(second_read)
            wait_for(waiting_on_the_lock, "the second reader to wait on the rollups' lock")
            first.commit()
            queued.result(timeout=30)
    assert second_reads == []  # nothing rated again: the stored spans were current
