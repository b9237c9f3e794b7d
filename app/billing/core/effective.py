"""Effective GPU-hours: rented - credited - unmeasured - idle, per rental.

API:
    minute_spans(minute_starts) -> list[Span]
    effective_usage(rated, idle_by_gpu) -> EffectiveUsage
    effective_of(rated, idle_s) -> EffectiveUsage
    overlap(span, spans) -> int                    # seconds of span covered by sorted spans

Idle minutes come from metering (``app.metering.reads.idle_minutes``: mean utilisation
strictly below the threshold; minutes without a sample are not idle). Only seconds in the
``billable`` bucket count as idle (credited or unbilled seconds are already excluded).
Unmeasured seconds (no telemetry arrived, or the GPU was in maintenance) are not effective:
nothing shows the GPU did work then.
"""

from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal

from app.billing.core.domain import Bucket
from app.billing.core.intervals import Span
from app.billing.core.rating import RatedRental

_UNMEASURED = (Bucket.UNMETERED, Bucket.MAINTENANCE)
_HOUR = Decimal(3600)
_HOURS_QUANTUM = Decimal("0.000001")


@dataclass(frozen=True)
class EffectiveUsage:
    rented_s: int
    credited_s: int
    idle_s: int
    unmeasured_s: int = 0

    @property
    def effective_s(self) -> int:
        return self.rented_s - self.credited_s - self.unmeasured_s - self.idle_s

    @property
    def effective_gpu_hours(self) -> Decimal:
        return (self.effective_s / _HOUR).quantize(_HOURS_QUANTUM)

    def __add__(self, other: "EffectiveUsage") -> "EffectiveUsage":
        return EffectiveUsage(
            self.rented_s + other.rented_s,
            self.credited_s + other.credited_s,
            self.idle_s + other.idle_s,
            self.unmeasured_s + other.unmeasured_s,
        )


def minute_spans(minute_starts: Iterable[int]) -> list[Span]:
    """The merged spans covered by whole minutes starting at ``minute_starts`` (ascending).

    One linear pass: a month of idle minutes is tens of thousands of them per GPU.
    """
    spans: list[Span] = []
    minutes = iter(minute_starts)
    first = next(minutes, None)
    if first is None:
        return spans
    start = last = first
    for minute in minutes:  # a span is written when its run ends, not rebuilt every minute
        if minute != last + 60:
            spans.append((start, last + 60))
            start = minute
        last = minute
    spans.append((start, last + 60))
    return spans


def overlap(span: Span, spans: Sequence[Span]) -> int:
    """Seconds of ``span`` covered by the sorted, disjoint ``spans``."""
    i = max(bisect_right(spans, span[0], key=lambda s: s[0]) - 1, 0)
    covered = 0
    while i < len(spans) and spans[i][0] < span[1]:
        covered += max(0, min(spans[i][1], span[1]) - max(spans[i][0], span[0]))
        i += 1
    return covered


def effective_usage(
    rated: RatedRental, idle_by_gpu: Mapping[str, Sequence[Span]]
) -> EffectiveUsage:
    idle = 0
    for piece in rated.pieces:
        if piece.bucket is Bucket.BILLABLE:
            idle += overlap((piece.start, piece.end), idle_by_gpu.get(piece.gpu_uuid, ()))
    return effective_of(rated, idle)


def effective_of(rated: RatedRental, idle_s: int) -> EffectiveUsage:
    """The rental's effective usage given its idle seconds (from rollups or ``overlap``)."""
    unmeasured = sum(rated.buckets.get(b, 0) for b in _UNMEASURED)
    return EffectiveUsage(rated.rented_s, rated.credited_s, idle_s, unmeasured)
