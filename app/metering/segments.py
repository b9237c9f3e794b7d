"""Pure interval logic of ingest: judge each record against stored segments, then merge.

A record ``[s, e)`` of a GPU is judged against the seconds already covered (stored segments
plus records accepted earlier in the same batch):

- none covered: accepted;
- all covered, every covered second in the record's state: a duplicate (changes nothing);
- otherwise (another state on any covered second, or only part covered): a conflict.

Identity is judged on the seconds and the state alone, because that is all billing reads and
all a merged segment still knows: segments keep no record boundaries, and minute metrics keep
per-minute sums, not per-record values, so a re-sent record's metrics cannot be compared
exactly. The first copy's metrics stand; a duplicate's are ignored. A partial overlap is never
a re-send of an identical record (the agent never re-cuts records), so it is a conflict too.

After judging, adjacent runs of one state are merged into maximal segments, which makes
extension in place, gap filling and late (out-of-order) records the same operation.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field, replace
from typing import Any


@dataclass(frozen=True, slots=True, order=True)
class Span:
    start: int
    end: int
    state: str
    evidence: dict[str, Any] | None = field(default=None, compare=False)


@dataclass(slots=True)
class Judgement:
    accepted: list[int] = field(default_factory=list)  # indices into the batch's records
    duplicates: list[int] = field(default_factory=list)
    conflicts: list[tuple[int, str]] = field(default_factory=list)  # (index, message)


@dataclass(frozen=True, slots=True)
class Changes:
    upserts: list[Span]  # new or changed segments, keyed by start
    deletes: list[int]  # starts of stored segments absorbed into others
    created: list[int]  # starts that no stored segment had: a run begins there


def judge(stored: list[Span], records: list[tuple[int, Span]], judgement: Judgement) -> list[Span]:
    """Judge ``records`` (batch index, span), sorted by start; return the covered spans after."""
    cover = sorted(stored)
    for index, record in records:
        verdict = _verdict(cover, record)
        if verdict is None:
            bisect.insort(cover, record)
            judgement.accepted.append(index)
        elif verdict == "":
            judgement.duplicates.append(index)
        else:
            judgement.conflicts.append((index, verdict))
    return cover


def _verdict(cover: list[Span], record: Span) -> str | None:
    """None: new seconds; "": a duplicate; otherwise the conflict, described."""
    first = max(0, bisect.bisect_left(cover, Span(record.start, record.start, "")) - 1)
    overlapping = [s for s in cover[first:] if s.start < record.end and s.end > record.start]
    if not overlapping:
        return None
    other = [s for s in overlapping if s.state != record.state]
    if other:
        s = other[0]
        return (
            f"seconds [{max(s.start, record.start)}, {min(s.end, record.end)}) are stored as "
            f"{s.state!r}, this record says {record.state!r}"
        )
    covered = sum(min(s.end, record.end) - max(s.start, record.start) for s in overlapping)
    if covered == record.end - record.start:
        return ""
    return (
        f"record [{record.start}, {record.end}) overlaps stored seconds of the same state "
        f"only in part ({covered} of {record.end - record.start} s)"
    )


def merge(spans: list[Span]) -> list[Span]:
    """Sorted, non-overlapping spans with adjacent same-state runs joined (first's evidence)."""
    merged: list[Span] = []
    for span in spans:
        last = merged[-1] if merged else None
        if last is not None and last.end == span.start and last.state == span.state:
            merged[-1] = replace(last, end=span.end, evidence=last.evidence or span.evidence)
        else:
            merged.append(span)
    return merged


def changes(stored: list[Span], merged: list[Span]) -> Changes:
    """What to write so that the stored segments become ``merged``."""
    before = {s.start: s for s in stored}
    after = {s.start for s in merged}
    upserts = [s for s in merged if before.get(s.start) != s]
    deletes = [start for start in before if start not in after]
    return Changes(upserts, deletes, [s.start for s in upserts if s.start not in before])


def gaps(segments: list[Span], start: int, end: int) -> list[tuple[int, int]]:
    """The seconds of ``[start, end)`` no segment covers (unmetered), as intervals."""
    out, cursor = [], start
    for s in segments:
        if s.start > cursor:
            out.append((cursor, min(s.start, end)))
        cursor = max(cursor, s.end)
        if cursor >= end:
            break
    if cursor < end:
        out.append((cursor, end))
    return [(a, b) for a, b in out if a < b]
