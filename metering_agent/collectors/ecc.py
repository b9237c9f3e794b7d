"""Volatile (since last reset) corrected and uncorrected ECC error counts."""

from types import ModuleType
from typing import Any

from metering_agent.collectors.base import query
from metering_agent.nvml.provider import GpuReading


def collect(nv: ModuleType, handle: Any, r: GpuReading) -> None:
    count = nv.nvmlDeviceGetTotalEccErrors
    r.ecc_corrected_volatile = query(
        nv, r, "ecc_corrected_volatile", count, handle,
        nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_VOLATILE_ECC,
    )  # fmt: skip
    r.ecc_uncorrected_volatile = query(
        nv, r, "ecc_uncorrected_volatile", count, handle,
        nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC,
    )  # fmt: skip
