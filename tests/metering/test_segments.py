"""The pure interval logic: any order of arrival gives the same maximal segments."""

from __future__ import annotations

from itertools import pairwise

from hypothesis import given
from hypothesis import strategies as st

from app.metering.segments import Judgement, Span, changes, gaps, judge, merge


@st.composite
def timelines(draw: st.DrawFn) -> list[Span]:
    """Contiguous-or-gapped records of one GPU, each within one minute."""
    spans, t = [], 0
    for _ in range(draw(st.integers(1, 30))):
        t += draw(st.sampled_from([0, 0, 0, 7]))  # sometimes a gap
        length = draw(st.integers(1, 60 - t % 60))
        spans.append(Span(t, t + length, draw(st.sampled_from(["healthy", "healthy", "failed"]))))
        t += length
    return spans


def store(stored: list[Span], batch: list[Span]) -> tuple[list[Span], Judgement]:
    judgement = Judgement()
    indexed = sorted(enumerate(batch), key=lambda item: item[1].start)
    return merge(judge(stored, indexed, judgement)), judgement


def per_second(spans: list[Span]) -> dict[int, str]:
    return {t: s.state for s in spans for t in range(s.start, s.end)}


@given(timelines(), st.randoms(use_true_random=False), st.integers(1, 5))
def test_any_arrival_order_and_batching_gives_the_same_segments(
    records: list[Span], rng, batches: int
) -> None:
    shuffled = records[:]
    rng.shuffle(shuffled)
    stored: list[Span] = []
    for k in range(batches):
        stored, judgement = store(stored, shuffled[k::batches])
        assert not judgement.conflicts
    assert stored == merge(records)
    assert per_second(stored) == per_second(records)
    # maximal: no two adjacent segments share a state
    assert all(a.end < b.start or a.state != b.state for a, b in pairwise(stored))
    # resending everything is all duplicates and changes nothing
    again, judgement = store(stored, records)
    assert again == stored and len(judgement.duplicates) == len(records)


def test_judgement_of_overlaps() -> None:
    stored = [Span(0, 30, "healthy")]
    _, j = store(
        stored,
        [
            Span(10, 20, "healthy"),
            Span(20, 40, "healthy"),
            Span(25, 28, "failed"),
            Span(30, 40, "healthy"),
        ],
    )
    assert j.duplicates == [0] and j.accepted == [3]
    assert [i for i, _ in j.conflicts] == [1, 2]


def test_changes_extend_in_place_and_delete_absorbed_segments() -> None:
    stored = [Span(0, 10, "healthy"), Span(20, 30, "healthy")]
    merged = merge(judge(stored, [(0, Span(10, 20, "healthy"))], Judgement()))
    delta = changes(stored, merged)
    assert delta.upserts == [Span(0, 30, "healthy")]
    assert (delta.deletes, delta.created) == ([20], [])


def test_gaps_are_the_uncovered_seconds() -> None:
    spans = [Span(10, 20, "healthy"), Span(20, 25, "failed"), Span(40, 50, "healthy")]
    assert gaps(spans, 0, 60) == [(0, 10), (25, 40), (50, 60)]
    assert gaps(spans, 12, 45) == [(25, 40)]
    assert gaps([], 5, 6) == [(5, 6)]
