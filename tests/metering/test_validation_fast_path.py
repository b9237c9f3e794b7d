"""A steady batch's checks run flat (``validation._records_valid``): they pass exactly the
records-only batches that the thorough checks, which word each problem, find nothing in."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from app.metering.models import GPU_MODEL_LENGTH, GPU_UUID_LENGTH
from app.metering.validation import INT32_MAX, _errors, _records_valid
from app.settings import Settings
from metering_agent.protocol import GpuState, IngestBatch, UsageRecord

NOW = 1_800_000_000
SETTINGS = Settings()
OLDEST = NOW - SETTINGS.ingest_retention_days * 86_400

seconds = st.integers(OLDEST - 120, NOW + 120)
counts = st.integers(-2, INT32_MAX + 2) | st.integers(-2, 120)
ints = st.none() | st.integers(-2, 100) | st.sampled_from([INT32_MAX, INT32_MAX + 1])
floats = st.none() | st.floats(-1, 1e6) | st.sampled_from([math.nan, math.inf, -0.0])
names = st.sampled_from(["GPU-1", "", "x" * GPU_UUID_LENGTH, "x" * (GPU_UUID_LENGTH + 1), "a\x00"])
models = st.sampled_from(["H100", "", "m" * GPU_MODEL_LENGTH, "m" * (GPU_MODEL_LENGTH + 1)])


@st.composite
def records(draw: st.DrawFn) -> UsageRecord:
    start = draw(seconds)
    end = start + draw(st.integers(-1, 62))
    return UsageRecord(
        gpu_uuid=draw(names), model=draw(models), start=start, end=end,
        state=GpuState.HEALTHY, sample_count=draw(counts), gpu_util_mean=draw(floats),
        gpu_util_max=draw(ints), mem_util_mean=draw(floats), mem_used_max_mib=draw(ints),
        mem_total_mib=draw(ints), energy_j=draw(floats), power_max_w=draw(floats),
        temp_max_c=draw(ints), device_index=draw(ints), minor_number=draw(ints),
    )  # fmt: skip


@settings(max_examples=3000, deadline=None)
@given(st.lists(records(), min_size=1, max_size=4))
def test_the_flat_checks_agree_with_the_thorough_ones(batch_records: list[UsageRecord]) -> None:
    batch = IngestBatch(batch_id="b", records=batch_records)
    flat = _records_valid(batch_records, OLDEST, NOW + SETTINGS.max_clock_skew_s)
    assert flat == (_errors(batch, SETTINGS, NOW, OLDEST) == [])
