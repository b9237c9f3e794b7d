"""Half-open integer interval algebra: ``Span = (start, end)`` means [start, end).

All functions are O(n log n) at worst (sorting) and never iterate over seconds.

API:
    merge(spans) -> list[Span]                 # sorted union; adjacent spans fuse
    subtract(spans, holes) -> list[Span]       # merged spans minus merged holes
    clip(span, bounds) -> Span | None          # intersection, None when empty
    total(spans) -> int                        # summed length
"""

from collections.abc import Iterable

Span = tuple[int, int]


def merge(spans: Iterable[Span]) -> list[Span]:
    merged: list[Span] = []
    for start, end in sorted(s for s in spans if s[0] < s[1]):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def subtract(spans: Iterable[Span], holes: Iterable[Span]) -> list[Span]:
    result: list[Span] = []
    hole_list = merge(holes)
    i = 0
    for start, end in merge(spans):
        # Holes entirely before this span can never matter again: spans are sorted.
        while i < len(hole_list) and hole_list[i][1] <= start:
            i += 1
        cursor, j = start, i
        while j < len(hole_list) and hole_list[j][0] < end:
            if hole_list[j][0] > cursor:
                result.append((cursor, hole_list[j][0]))
            cursor = max(cursor, hole_list[j][1])
            j += 1
        if cursor < end:
            result.append((cursor, end))
    return result


def clip(span: Span, bounds: Span) -> Span | None:
    start, end = max(span[0], bounds[0]), min(span[1], bounds[1])
    return (start, end) if start < end else None


def total(spans: Iterable[Span]) -> int:
    return sum(end - start for start, end in spans)
