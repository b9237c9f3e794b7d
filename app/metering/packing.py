"""Minute metrics packed 60 to a GPU-hour row: fixed-size slots in one ``bytea``.

Each minute is a 19-byte slot of small integers (struct ``SLOT``). Sums and counts rather than
means, so several records of one minute (a state change mid-minute) combine exactly. Maxima and
energy are stored as ``value + 1`` so that an all-zero slot means "nothing observed" and the
maximum of two slots is the plain maximum. Values are clamped into their field's range.

Closed hours are stored compressed (``stored`` / ``loaded``): Postgres compresses a value only
once its row passes the ~2 KB TOAST threshold, whatever ``toast_tuple_target`` says, so these
1.2 KB rows were kept raw (1,144 B of the 1,448 B a GPU-hour cost; measured with
``pg_column_size``). The open hour, rewritten every upload, stays raw.
"""

from __future__ import annotations

import math
import struct
import zlib
from collections.abc import Iterable
from dataclasses import dataclass

from metering_agent.protocol import MINUTE, UsageRecord

HOUR = 3600
SLOTS = HOUR // MINUTE
# observed s, util n, util sum, util max+1, mem n, mem util sum, mem used max MiB+1,
# energy dJ+1, power max dW+1, temperature max C+1
SLOT = struct.Struct("<BBHBBHIIHB")
ROW_BYTES = SLOT.size * SLOTS
EMPTY_ROW = bytes(ROW_BYTES)
# Raw deflate (no header, no checksum) with a 4 KB window, the smallest power of two above a
# row: zlib sets up a 32 KB window and hash tables for every stream, which cost more than
# deflating 1,140 bytes (98 µs a row with the 32 KB window and memLevel 9, 40 µs with these;
# the same bytes out). Every GPU's hour closes in the same upload round. Readers inflate with
# a 32 KB window, which reads either.
DEFLATE_WINDOW_BITS = 12


@dataclass(frozen=True, slots=True)
class Minute:
    """One minute of one GPU, decoded."""

    start: int
    observed_s: int
    util_n: int
    util_sum: int
    util_max: int | None
    mem_util_n: int
    mem_util_sum: int
    mem_used_max_mib: int | None
    energy_j: float | None
    power_max_w: float | None
    temp_max_c: int | None

    @property
    def util_mean(self) -> float | None:
        return self.util_sum / self.util_n if self.util_n else None


def hour_of(second: int) -> int:
    return second - second % HOUR


def _clamp(value: float | None, limit: int, *, plus_one: bool = False) -> int:
    if value is None or not math.isfinite(value):
        return 0
    return max(0, min(limit, round(value) + plus_one))


def record_slot(r: UsageRecord) -> tuple[int, ...]:
    """The slot fields one record contributes to its minute (called per record: kept flat)."""
    n = r.sample_count
    util_n = n if r.gpu_util_mean is not None else 0
    mem_n = n if r.mem_util_mean is not None else 0
    return (
        _clamp(n, 0xFF),
        _clamp(util_n, 0xFF),
        _clamp((r.gpu_util_mean or 0) * util_n, 0xFFFF),
        _clamp(r.gpu_util_max, 0xFF, plus_one=True),
        _clamp(mem_n, 0xFF),
        _clamp((r.mem_util_mean or 0) * mem_n, 0xFFFF),
        _clamp(r.mem_used_max_mib, 0xFFFFFFFF, plus_one=True),
        _clamp(None if r.energy_j is None else r.energy_j * 10, 0xFFFFFFFF, plus_one=True),
        _clamp(None if r.power_max_w is None else r.power_max_w * 10, 0xFFFF, plus_one=True),
        _clamp(r.temp_max_c, 0xFF, plus_one=True),
    )


def combine(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """Two slots of one minute as one: counts and sums add up (clamped), maxima are the
    larger; energy (both stored +1) adds the values and keeps one offset. Spelled out field by
    field: it runs for every record of every upload."""
    energy = min(0xFFFFFFFF, a[7] + b[7] - 1) if a[7] and b[7] else max(a[7], b[7])
    return (
        min(0xFF, a[0] + b[0]),
        min(0xFF, a[1] + b[1]),
        min(0xFFFF, a[2] + b[2]),
        max(a[3], b[3]),
        min(0xFF, a[4] + b[4]),
        min(0xFFFF, a[5] + b[5]),
        max(a[6], b[6]),
        energy,
        max(a[8], b[8]),
        max(a[9], b[9]),
    )


def add_records(row: bytes, records: Iterable[UsageRecord], first_slot: int = 0) -> bytes:
    """The row with each record (all of this row's hour) combined into its minute's slot.
    With ``first_slot``, ``row`` is the span of a row from that slot on (ingest reads and
    rewrites only the slots an upload touches: ``span_bounds``); every record must fall in it."""
    data = bytearray(row)
    base = first_slot * SLOT.size
    for r in records:
        offset = (r.start % HOUR) // MINUTE * SLOT.size - base
        slot = record_slot(r)
        current = SLOT.unpack_from(data, offset)
        # Most minutes get one record into an empty slot: no combining needed.
        SLOT.pack_into(data, offset, *(combine(current, slot) if any(current) else slot))
    return bytes(data)


def span_bounds(records: Iterable[UsageRecord]) -> tuple[int, int]:
    """The first slot and the number of slots from it that the records (of one hour) touch."""
    indexes = [(r.start % HOUR) // MINUTE for r in records]
    return min(indexes), max(indexes) - min(indexes) + 1


def stored(row: bytes) -> bytes:
    """A closed hour as stored: its bytes regrouped by offset within the slot (each byte of
    each field, for the 60 minutes, together: counts that repeat, high bytes that barely
    move), then deflated; the row itself when that is not shorter. ~770 B for a busy hour."""
    planes = b"".join(row[i :: SLOT.size] for i in range(SLOT.size))
    packer = zlib.compressobj(9, zlib.DEFLATED, -DEFLATE_WINDOW_BITS, 8)
    packed = packer.compress(planes) + packer.flush()
    return packed if len(packed) < ROW_BYTES else row


def loaded(data: bytes) -> bytes:
    """The row ``stored`` made of it; a raw row (ROW_BYTES long: the open hour, rows written
    before compression, the simulator's) is returned as it is."""
    if len(data) == ROW_BYTES:
        return data
    row = bytearray(ROW_BYTES)
    for i, plane in enumerate(planes(data, range(SLOT.size))):
        row[i :: SLOT.size] = plane
    return bytes(row)


def planes(data: bytes, offsets: Iterable[int]) -> list[bytes]:
    """For each byte offset within the slot, that byte of the 60 minutes, from a row as
    ``stored`` made it or a raw one: what a reader of a few fields needs, not the whole row."""
    if len(data) == ROW_BYTES:
        return [data[i :: SLOT.size] for i in offsets]
    grouped = zlib.decompress(data, -15)
    return [grouped[i * SLOTS : (i + 1) * SLOTS] for i in offsets]


def _opt(stored: int, scale: float = 1.0) -> float | None:
    return None if stored == 0 else (stored - 1) / scale


def minutes(hour: int, row: bytes) -> list[Minute]:
    """The observed minutes of a row, in time order."""
    out = []
    for i, f in enumerate(SLOT.iter_unpack(row)):
        if f[0] == 0:
            continue
        util_max, mem_max, temp = _opt(f[3]), _opt(f[6]), _opt(f[9])
        out.append(
            Minute(
                start=hour + i * MINUTE,
                observed_s=f[0],
                util_n=f[1],
                util_sum=f[2],
                util_max=None if util_max is None else int(util_max),
                mem_util_n=f[4],
                mem_util_sum=f[5],
                mem_used_max_mib=None if mem_max is None else int(mem_max),
                energy_j=_opt(f[7], 10),
                power_max_w=_opt(f[8], 10),
                temp_max_c=None if temp is None else int(temp),
            )
        )
    return out
