"""Shared NVML call helpers: tolerate "not supported" per call and per field, surface lost GPUs."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any, TypeVar

from metering_agent.nvml.provider import GpuReading

T = TypeVar("T")

# Errors after which nothing on the device can be read: the GPU is failed, not "unsupported".
LOST_ERROR_NAMES = ("NVML_ERROR_GPU_IS_LOST", "NVML_ERROR_RESET_REQUIRED")

_VALUE_MEMBERS = {
    0: "dVal",
    1: "uiVal",
    2: "ulVal",
    3: "ullVal",
    4: "sllVal",
    5: "siVal",
    6: "usVal",
}


class GpuLost(Exception):
    """The device stopped answering (fell off the bus, needs a reset)."""


def text(value: str | bytes) -> str:
    """NVML strings (UUIDs, names) as str: older pynvml returns bytes."""
    return value.decode() if isinstance(value, bytes) else value


def lost_codes(nv: ModuleType) -> set[int]:
    return {getattr(nv, name) for name in LOST_ERROR_NAMES if hasattr(nv, name)}


def query(nv: ModuleType, r: GpuReading, name: str, fn: Callable[..., T], *args: Any) -> T | None:
    """Call ``fn``; on an NVML error note it against ``name`` and return None (lost GPUs raise)."""
    try:
        return fn(*args)
    except nv.NVMLError as e:
        if e.value in lost_codes(nv):
            raise GpuLost(str(e)) from e
        r.unsupported[name] = str(e)
        return None


def field_values(
    nv: ModuleType, handle: Any, r: GpuReading, fields: dict[str, int]
) -> dict[str, int | float | None]:
    """Read several NVML field ids at once; each field fails or succeeds on its own."""
    values = query(
        nv, r, "+".join(fields), nv.nvmlDeviceGetFieldValues, handle, list(fields.values())
    )
    if values is None:
        return dict.fromkeys(fields)
    out: dict[str, int | float | None] = {}
    for name, value in zip(fields, values, strict=True):
        if value.nvmlReturn == nv.NVML_SUCCESS:
            out[name] = getattr(value.value, _VALUE_MEMBERS[value.valueType])
            continue
        if value.nvmlReturn in lost_codes(nv):
            raise GpuLost(str(nv.NVMLError(value.nvmlReturn)))
        r.unsupported[name] = str(nv.NVMLError(value.nvmlReturn))
        out[name] = None
    return out


def as_int(value: int | float | None) -> int | None:
    return None if value is None else int(value)
