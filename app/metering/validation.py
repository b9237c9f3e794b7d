"""Semantic checks of an ingest batch, beyond the wire types: the protocol's own checks plus
what the database needs (retention, lengths, ranges, no NUL characters)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import fields
from typing import Any

from app.core.schemas import storable_text
from app.metering.models import GPU_MODEL_LENGTH, GPU_UUID_LENGTH, HealthEventRow
from app.settings import Settings
from metering_agent.protocol import (
    MINUTE,
    PROTOCOL_VERSION,
    FieldError,
    IngestBatch,
    UsageRecord,
    event_errors,
    record_errors,
)

DAY = 86_400
INT32_MAX = 2**31 - 1
DETAIL_MAX_BYTES = 8192
DETAIL_MAX_DEPTH = 8


def _width(column: Any) -> int:
    return column.type.length


# Column widths, read from the models: longer strings are refused here, not by the database.
MAX_LENGTHS = {
    "gpu_uuid": GPU_UUID_LENGTH,
    "model": GPU_MODEL_LENGTH,
    "event_id": _width(HealthEventRow.event_id),
    "rule": _width(HealthEventRow.rule),
}
INT32_FIELDS = (
    "gpu_util_max",
    "mem_used_max_mib",
    "mem_total_mib",
    "temp_max_c",
    "code",
    "device_index",
    "minor_number",
)
FLOAT_FIELDS = ("gpu_util_mean", "mem_util_mean", "energy_j", "power_max_w")


def batch_errors(batch: IngestBatch, settings: Settings, now: int) -> list[FieldError]:
    """Every problem of the batch, each located; none for a valid one. A batch of records only
    that ``_records_valid`` passes has none (the steady agent's: checked in a fraction of the
    time); any other goes through every check, which finds and words each problem."""
    oldest = now - settings.ingest_retention_days * DAY
    if (
        not batch.events
        and batch.protocol_version == PROTOCOL_VERSION
        and 1 <= len(batch.batch_id) <= 200
        and storable_text(batch.batch_id)
        and _records_valid(batch.records, oldest, now + settings.max_clock_skew_s)
    ):
        return []
    return _errors(batch, settings, now, oldest)


def _records_valid(records: list[UsageRecord], oldest: int, latest_end: int) -> bool:
    """Whether every record passes every check of ``_errors`` (the same bounds, spelled out
    flat, field by field: it runs for every record of every upload; ``_FLAT_CHECKED`` says
    which). Each GPU's UUID and model are checked once per batch, not once per record."""
    names: set[tuple[str, str]] = set()
    top, inf = INT32_MAX, math.inf  # NaN fails both comparisons of a reading's check
    for r in records:
        start, end = r.start, r.end
        if not (
            oldest <= start < end <= start - start % MINUTE + MINUTE
            and end <= latest_end
            and 0 <= r.sample_count <= end - start
            and ((i := r.gpu_util_max) is None or 0 <= i <= top)
            and ((i := r.mem_used_max_mib) is None or 0 <= i <= top)
            and ((i := r.mem_total_mib) is None or 0 <= i <= top)
            and ((i := r.temp_max_c) is None or 0 <= i <= top)
            and ((i := r.device_index) is None or 0 <= i <= top)
            and ((i := r.minor_number) is None or 0 <= i <= top)
            and ((x := r.gpu_util_mean) is None or 0 <= x < inf)
            and ((x := r.mem_util_mean) is None or 0 <= x < inf)
            and ((x := r.energy_j) is None or 0 <= x < inf)
            and ((x := r.power_max_w) is None or 0 <= x < inf)
        ):
            return False
        names.add((r.gpu_uuid, r.model))
    return all(
        1 <= len(gpu) <= GPU_UUID_LENGTH
        and 1 <= len(model) <= GPU_MODEL_LENGTH
        and storable_text(gpu)
        and storable_text(model)
        for gpu, model in names
    )


# The bounded fields of a record that ``_records_valid`` checks one by one: a field added to
# the bounds must be added there too (import fails until it is).
_FLAT_CHECKED = {
    "gpu_util_max", "mem_used_max_mib", "mem_total_mib", "temp_max_c", "device_index",
    "minor_number", "gpu_util_mean", "mem_util_mean", "energy_j", "power_max_w", "gpu_uuid",
    "model",
}  # fmt: skip
_BOUNDED = {*INT32_FIELDS, *FLOAT_FIELDS, *MAX_LENGTHS}
assert {f.name for f in fields(UsageRecord)} & _BOUNDED == _FLAT_CHECKED, (
    "validation._records_valid does not check every bounded field of a record"
)


def _errors(batch: IngestBatch, settings: Settings, now: int, oldest: int) -> list[FieldError]:
    skew = settings.max_clock_skew_s
    errors: list[FieldError] = []
    if batch.protocol_version != PROTOCOL_VERSION:
        errors.append(
            FieldError(
                ("protocol_version",), f"unsupported; this service speaks {PROTOCOL_VERSION}"
            )
        )
    errors += _field_errors(("batch_id",), batch.batch_id, 200)
    for i, r in enumerate(batch.records):
        errors += record_errors(r, i, now=now, max_skew_s=skew)
        if r.start < oldest:
            errors.append(
                FieldError(
                    ("records", i, "start"),
                    f"start {r.start} is older than the retention of "
                    f"{settings.ingest_retention_days} days",
                )
            )
        errors += _item_errors(("records", i), r)
    for i, e in enumerate(batch.events):
        errors += event_errors(e, i, now=now, max_skew_s=skew)
        if e.at < oldest:
            errors.append(FieldError(("events", i, "at"), "older than the retention period"))
        errors += _item_errors(("events", i), e)
        errors += _detail_errors(("events", i, "detail"), e.detail)
    return errors


def _detail_errors(loc: tuple[str | int, ...], detail: Any) -> Iterator[FieldError]:
    """Evidence is small and flat: bounded in size and nesting, so no batch can bloat the
    table or the timelines that show it."""
    if not _storable_json(detail):
        yield FieldError(loc, "must be plain JSON without NUL characters")
    elif len(json.dumps(detail, ensure_ascii=False).encode()) > DETAIL_MAX_BYTES:
        yield FieldError(loc, f"must be at most {DETAIL_MAX_BYTES} bytes of JSON")
    if _depth(detail) > DETAIL_MAX_DEPTH:
        yield FieldError(loc, f"must nest at most {DETAIL_MAX_DEPTH} levels deep")


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


def _item_errors(loc: tuple[str | int, ...], item: Any) -> Iterator[FieldError]:
    for name, limit in MAX_LENGTHS.items():
        value = getattr(item, name, None)
        if value is not None:
            yield from _field_errors((*loc, name), value, limit)
    for name in INT32_FIELDS:
        value = getattr(item, name, None)
        if value is not None and not 0 <= value <= INT32_MAX:
            yield FieldError((*loc, name), f"{value} is out of range 0..{INT32_MAX}")
    for name in FLOAT_FIELDS:
        value = getattr(item, name, None)
        if value is not None and not (math.isfinite(value) and value >= 0):
            yield FieldError((*loc, name), f"{value} must be a finite number >= 0")


def _field_errors(loc: tuple[str | int, ...], value: str, limit: int) -> Iterator[FieldError]:
    if not 1 <= len(value) <= limit:
        yield FieldError(loc, f"length must be 1..{limit}, not {len(value)}")
    if not storable_text(value):
        yield FieldError(loc, "must be valid UTF-8 text without NUL characters")


def _storable_json(value: Any) -> bool:
    """JSONB takes no NaN/Infinity and, like text, no NUL or lone surrogate."""
    try:
        dumped = json.dumps(value, allow_nan=False, ensure_ascii=False)
    except ValueError:
        return False
    return "\\u0000" not in dumped and storable_text(dumped)
