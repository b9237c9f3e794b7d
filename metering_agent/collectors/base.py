"""Shared NVML call helpers: tolerate "not supported" per call and per field, surface lost GPUs.

A collector is ``collect(sample)``: it reads its signal through ``query`` / ``field_values``, which
record a failing call in ``reading.unsupported`` (and, for ``--probe``, every call's result and
duration in ``sample.trace``), count what succeeded, and raise ``GpuLost`` when the device is gone.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable
from dataclasses import dataclass, field
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

FieldRequest = tuple[str, int, int]  # (key, field id, scope id); "family:n" keys share a reason


class GpuLost(Exception):
    """The device stopped answering (fell off the bus, needs a reset)."""


@dataclass(slots=True)
class CallRecord:
    """One NVML call as ``--probe`` reports it."""

    call: str
    ms: float
    result: Any = None
    error: str | None = None


@dataclass(slots=True)
class DeviceState:
    """What the collectors keep about one GPU from one sample to the next."""

    links: int | None = None  # NVLink links present; None until the first slow read
    links_ever_up: set[int] = field(default_factory=set)
    crc_choice: int = 0  # index into nvlink.CRC_CHOICES: the CRC counters this GPU answers
    crc_seen: bool = False  # the chosen CRC counters answered at least once
    variant: dict[str, int] = field(default_factory=dict)  # signal -> first Variant that exists
    slow: dict[str, Any] = field(default_factory=dict)  # last slow-signal values, by attribute
    slow_unsupported: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class Sample:
    """One GPU's sample in progress."""

    nv: ModuleType
    handle: Any
    reading: GpuReading
    device: DeviceState
    succeeded: int = 0  # calls and fields that returned a value
    unknown: int = 0  # calls and fields that failed with NVML_ERROR_UNKNOWN
    calls: int = 0  # NVML calls made (the cost the benchmark reports)
    trace: list[CallRecord] | None = None  # set by --probe


def text(value: str | bytes) -> str:
    """NVML strings (UUIDs, names) as str: older pynvml returns bytes."""
    return value.decode() if isinstance(value, bytes) else value


def lost_codes(nv: ModuleType) -> set[int]:
    return {getattr(nv, name) for name in LOST_ERROR_NAMES if hasattr(nv, name)}


def _note_error(s: Sample, name: str, code: int, message: str) -> None:
    if code in lost_codes(s.nv):
        raise GpuLost(message)
    if code == s.nv.NVML_ERROR_UNKNOWN:
        s.unknown += 1
    s.reading.unsupported[name] = message


def call(s: Sample, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Call NVML, counting and (for --probe) timing it; errors propagate."""
    s.calls += 1
    started = time.perf_counter()
    try:
        result = fn(*args, **kwargs)
    except Exception as e:
        _trace(s, fn, started, error=str(e) or type(e).__name__)
        raise
    _trace(s, fn, started, result=result)
    return result


def _trace(s: Sample, fn: Callable[..., Any], started: float, **outcome: Any) -> None:
    if s.trace is not None:
        ms = round(1000 * (time.perf_counter() - started), 3)
        name = getattr(fn, "__name__", repr(fn))
        s.trace.append(CallRecord(name, ms, **{k: _plain(v) for k, v in outcome.items()}))


def _plain(value: Any) -> Any:
    """A JSON-friendly rendering of an NVML result for the probe."""
    if value is None or isinstance(value, int | float | str | bool):
        return value
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, list | tuple | ctypes.Array):
        return [_plain(v) for v in value] if len(value) <= 64 else f"{len(value)} items"
    members = getattr(value, "_fields_", None)
    if members is not None:
        return {m[0]: _plain(getattr(value, m[0])) for m in members if not m[0].startswith("_")}
    return repr(value)


def query(s: Sample, name: str, fn: Callable[..., T], *args: Any) -> T | None:
    """Call ``fn``; on an NVML error note it against ``name`` and return None (lost GPUs raise)."""
    try:
        value = call(s, fn, *args)
    except s.nv.NVMLError as e:
        _note_error(s, name, e.value, str(e))
        return None
    s.succeeded += 1
    return value


def field_values(s: Sample, requests: list[FieldRequest]) -> dict[str, int | float | None]:
    """Read several NVML fields (each with its scope, e.g. an NVLink link) in one call."""
    if not requests:
        return {}
    ids = [(fid, scope) for _key, fid, scope in requests]
    values = query(s, "field_values", s.nv.nvmlDeviceGetFieldValues, s.handle, ids)
    if values is None:
        return dict.fromkeys(key for key, _fid, _scope in requests)
    if s.trace is not None:
        s.trace[-1].result = f"{len(requests)} fields, one record each below"
    out: dict[str, int | float | None] = {}
    for (key, fid, scope), value in zip(requests, values, strict=True):
        error = None
        if value.nvmlReturn == s.nv.NVML_SUCCESS:
            s.succeeded += 1
            out[key] = getattr(value.value, _VALUE_MEMBERS[value.valueType])
        else:
            error = str(s.nv.NVMLError(value.nvmlReturn))
            out[key] = None
        if s.trace is not None:  # the call's time is on its own record, just before
            s.trace.append(CallRecord(f"  field {fid} scope {scope} ({key})", 0.0, out[key], error))
        if error is not None:
            _note_error(s, key.split(":")[0], value.nvmlReturn, error)
    return out


@dataclass(frozen=True, slots=True)
class Variant:
    """One way to read a signal; later variants stand in where the binding or driver lacks one."""

    function: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


def query_variants(s: Sample, name: str, variants: list[Variant]) -> Any | None:
    """The first variant the binding and the driver both have; remembered per GPU."""
    nv = s.nv
    for i in range(s.device.variant.get(name, 0), len(variants)):
        v = variants[i]
        fn = getattr(nv, v.function, None)
        try:
            if fn is None:  # this binding predates it
                raise nv.NVMLError(nv.NVML_ERROR_FUNCTION_NOT_FOUND)
            value = call(s, fn, s.handle, *v.args, **v.kwargs)
        except nv.NVMLLibraryMismatchError:
            pass  # the binding's unversioned call wraps a symbol this driver lacks
        except nv.NVMLError as e:
            if e.value != nv.NVML_ERROR_FUNCTION_NOT_FOUND:
                _note_error(s, name, e.value, str(e))
                return None
        else:
            s.device.variant[name] = i
            s.succeeded += 1
            return value
        s.device.variant[name] = i + 1
    names = ", ".join(v.function for v in variants)
    s.reading.unsupported[name] = f"neither binding nor driver has any of {names}"
    return None


def binding_constant(s: Sample, name: str, attr: str) -> int | None:
    """A constant newer bindings define; its absence makes ``attr`` unsupported, not a crash."""
    value: int | None = getattr(s.nv, name, None)
    if value is None:
        s.reading.unsupported[attr] = f"this nvidia-ml-py has no {name}; upgrade it"
    return value


def as_int(value: int | float | None) -> int | None:
    return None if value is None else int(value)
