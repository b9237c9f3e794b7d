"""Row remapping (Ampere and later) and page retirement (older GPUs): pending and failed."""

from types import ModuleType
from typing import Any

from metering_agent.collectors.base import query
from metering_agent.nvml.provider import GpuReading


def collect(nv: ModuleType, handle: Any, r: GpuReading) -> None:
    rows = query(nv, r, "remapped_rows", nv.nvmlDeviceGetRemappedRows, handle)
    if rows is not None:
        _corr, _unc, pending, failure = rows
        r.remap_pending, r.remap_failure = bool(pending), bool(failure)
    pages = query(nv, r, "retired_pages_pending", nv.nvmlDeviceGetRetiredPagesPendingStatus, handle)
    if pages is not None:
        r.retired_pages_pending = pages == nv.NVML_FEATURE_ENABLED
