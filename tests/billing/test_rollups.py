"""Rollups: the period to date from stored closed days plus the open day equals rating the
whole span, for arbitrary histories, also after late data changes a stored day.

The worlds are ``test_properties``' (three GPUs, three rentals, segments, maintenance,
migrations, two prices, caps, increments), stretched so one time unit is an hour: the period
(about four days) then has local days, a price change inside one of them, and sessions,
failures and migration windows that cross midnight. Stored days go through Postgres (the
``usage_rollups`` tables, their SQL sums), the rest is the pure core.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from app.billing import rollups
from app.billing.domain import Assignment, GpuState, Migration, PlanTerms, Segment
from app.billing.effective import effective_usage
from app.billing.intervals import Span, clip, merge
from app.billing.loader import BillingPeriod, PeriodInputs
from app.billing.rating import RatedRental, rate_rentals
from app.billing.whatif import DEFAULT_INCREMENTS, what_if, what_if_rated
from app.core.db import transaction
from app.customers.schemas import CustomerCreate
from app.customers.service import create_customer
from tests.billing.test_properties import GPUS, PERIOD, worlds

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
    return rate_rentals(**world, period=(SPAN[0], as_of), cap_period=SPAN)


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
def test_rollups_plus_the_open_day_equal_rating_the_span(
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
        world["rentals"],
        world["assignments"],
        world["segments_by_gpu"],
        world["maintenance_by_gpu"],
        world["migrations"],
        (0, later),
        cap_period=SPAN,
    )
    from_rollups = what_if_rated({i: to_date.rerated(i) for i in DEFAULT_INCREMENTS})
    assert from_rollups.rows == whole.rows


@settings(
    max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(world=worlds())
def test_the_open_days_idle_is_read_only_when_something_shows_it(
    db: Engine, customer: uuid.UUID, world: dict
) -> None:
    world = _stretch(world, {r: str(uuid.uuid4()) for r in ("r0", "r1", "r2")})
    reads: list[Span] = []

    def read_idle(gpus: Sequence[str], span: Span) -> dict[str, list[Span]]:
        reads.append(span)
        return {}

    as_of = SPAN[1] - 5 * H  # three closed days and the open one
    with Session(db) as session:
        inputs = _inputs(world, customer, (0, as_of))
        to_date = rollups.rated_to_date(session, customer, BILLING, as_of, inputs, read_idle)
        session.rollback()
    stored = list(reads)  # storing the closed days reads theirs: their rollups keep it
    assert all(end <= 72 * H for _, end in stored)
    to_date.rerated(60)  # the what-if: no idle read
    assert reads == stored
    assert set(to_date.idle_s) == {r.rental.rental_id for r in to_date.rated}
    assert reads == [*stored, (72 * H, as_of)]  # the usage API's idle: the open day's, once
