"""Rating a month of 3,000 GPUs accounts for every rented second; its speed is a benchmark
(bench/invoices.py), not a timed assertion that a busy machine would fail."""

import itertools
import random

from hypothesis import given
from hypothesis import strategies as st

from app.billing.core.domain import Assignment, GpuState, Migration, RatingInputs, Segment
from app.billing.core.rating import _swept_timeline, build_timeline, rate_rentals

from .factories import MONTH, rental, usd_plan

GPUS = 3000
SEGMENTS_PER_GPU = 200


def _fleet() -> tuple[list, list, dict, dict, list]:
    rng = random.Random(7)
    plan = usd_plan()
    rentals, assignments, segments, maintenance, migrations = [], [], {}, {}, []
    step = MONTH[1] // SEGMENTS_PER_GPU
    for g in range(GPUS):
        gpu, rid = f"gpu{g}", f"r{g // 2}"
        if g % 2 == 0:
            rentals.append(rental(plan, rid, gpus=2))
        half = rng.randrange(MONTH[1])
        assignments += [Assignment(rid, gpu, 0, half), Assignment(rid, gpu, half + 30, MONTH[1])]
        states = rng.choices(list(GpuState), weights=(90, 7, 3), k=SEGMENTS_PER_GPU)
        segments[gpu] = [Segment(gpu, i * step, (i + 1) * step, s) for i, s in enumerate(states)]
        maintenance[gpu] = [(half - 600, half - 300)]
        migrations.append(Migration(rid, gpu, gpu, half, half + 30))
    return rentals, assignments, segments, maintenance, migrations


def test_a_month_of_3000_gpus_accounts_for_every_rented_second() -> None:
    rentals, assignments, segments, maintenance, migrations = _fleet()
    rated = rate_rentals(
        RatingInputs(rentals, assignments, segments, maintenance, migrations, MONTH)
    )
    assert sum(r.rented_s for r in rated) == GPUS * MONTH[1]


@st.composite
def disjoint_segments(draw: st.DrawFn) -> list[Segment]:
    """Segments of one GPU in time order, none overlapping; some touch, some leave gaps."""
    cuts = sorted(set(draw(st.lists(st.integers(0, 200), min_size=0, max_size=12))))
    out = []
    for i, (start, end) in enumerate(itertools.pairwise(cuts)):
        if draw(st.booleans()):  # else a gap: no telemetry
            out.append(Segment("g", start, end, draw(st.sampled_from(list(GpuState))), {"n": i}))
    return out


@given(disjoint_segments())
def test_the_plain_timeline_is_the_sweep_s_when_segments_are_disjoint(
    segments: list[Segment],
) -> None:
    """Most GPUs take the shortcut (no overlap, no maintenance); it must be the same."""
    swept = _swept_timeline(segments, [])
    plain = build_timeline(segments, [])
    assert list(plain.cells_in(0, 201)) == list(swept.cells_in(0, 201))
