"""Idle minutes read straight from packed minute-metric rows (see ``packing``).

The usage page scans every minute of a month for every GPU of a customer, so this reads only
the two utilisation fields, by strided byte slices, and proves whole busy hours idle-free with
a few C-level operations before falling back to a per-minute scan. Decoding full slots costs
about 20 times more.
"""

from __future__ import annotations

import functools
import struct

from app.metering.packing import MINUTE, SLOTS, planes

# Byte offsets of the utilisation count (B) and sum (H) inside a slot, from SLOT's format.
_UTIL_N_AT = struct.calcsize("<B")
_UTIL_SUM_AT = struct.calcsize("<BB")
_ALL_MINUTES = int.from_bytes(bytes([1] * SLOTS))  # one 0x01 byte per minute of the hour
_UNOBSERVED = bytes([1] + [0] * 255)  # translate table: count 0 -> 1 (such a minute is not idle)
_NONZERO = bytes([0] + [1] * 255)
MAX_SAMPLES_PER_MINUTE = 60  # the agent samples at 1 Hz
# The floor of a closed hour not yet summarised (closed at an hour's turn, in SQL): below every
# threshold, so idle reads fetch the hour and scan it, as they would with its floor.
UNSUMMARISED = -1


def _util_fields(row: bytes) -> tuple[bytes, bytes, bytes]:
    """Per minute of a row (raw or as stored): utilisation sample counts, and the low and
    high bytes of their sums."""
    counts, lows, highs = planes(row, (_UTIL_N_AT, _UTIL_SUM_AT, _UTIL_SUM_AT + 1))
    return counts, lows, highs


@functools.lru_cache(maxsize=64)
def _busy_low_bytes(threshold_tenths: int) -> bytes:
    """Translate table for a sum's low byte: 1 where that sum alone proves the minute busy.

    A minute holds at most 60 one-second samples, so a utilisation sum of at least
    60 x threshold / 100 % (= 6 x threshold_tenths) means a mean at or above the threshold.
    """
    floor = MAX_SAMPLES_PER_MINUTE * threshold_tenths // 10
    return bytes(1 if low >= floor else 0 for low in range(256))


def _surely_busy(counts: bytes, lows: bytes, highs: bytes, threshold_tenths: int) -> bool:
    if MAX_SAMPLES_PER_MINUTE * threshold_tenths // 10 > 255:
        return False  # the bound would need the high byte too: let the exact scan decide
    proof = (
        int.from_bytes(counts.translate(_UNOBSERVED))
        | int.from_bytes(lows.translate(_busy_low_bytes(threshold_tenths)))
        | int.from_bytes(highs.translate(_NONZERO))
    )
    return proof == _ALL_MINUTES


@functools.lru_cache(maxsize=4096)  # the simulator shares one bytes object per steady hour
def util_floor_tenths(row: bytes) -> int | None:
    """floor(lowest per-minute mean GPU utilisation of the row), in tenths of a percent.

    Stored with each closed hour: the hour has an idle minute at an (integer) threshold T
    exactly when this is below T, so busy hours are skipped in SQL. None: no utilisation.
    """
    fields = zip(*_util_fields(row), strict=True)
    return min((10 * (low | high << 8) // n for n, low, high in fields if n), default=None)


def idle_minutes(hour: int, row: bytes, threshold_tenths: int) -> list[int]:
    """Starts of the row's observed minutes whose mean GPU utilisation is below
    ``threshold_tenths`` tenths of a percent (exact integer comparison of sum and count)."""
    counts, lows, highs = _util_fields(row)
    if _surely_busy(counts, lows, highs, threshold_tenths):
        return []
    return [
        hour + i * MINUTE
        for i, (n, low, high) in enumerate(zip(counts, lows, highs, strict=True))
        if n and 10 * (low | high << 8) < threshold_tenths * n
    ]
