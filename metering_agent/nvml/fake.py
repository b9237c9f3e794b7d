"""A fake pynvml for the real provider's tests and the agent benchmark, modelled on a binding.

``FakeNvml(binding).module()`` is a module with the binding's own constants, error classes and
structures, and only those functions that binding defines: code calling a name the binding
lacks fails as it would on a node with that binding. Handles are opaque ctypes device pointers
(event data carries a new pointer object to the same device, as the binding's does), field
values are the binding's ``c_nvmlFieldValue_t`` filled per (field id, scope id), and every call
is counted (``calls``).

Drivers and faults are knobs: ``driver_lacks`` (symbols missing from the driver's library: the
call raises FUNCTION_NOT_FOUND, the unversioned process call NVMLLibraryMismatchError as the
binding's wrapper does), and per GPU (``FakeGpu``) failing calls or fields, lost, every call
Unknown Error, unreadable at enumeration, and ``hang`` (every call blocks until the event is set,
at most ``HANG_LIMIT_S``).
"""

from __future__ import annotations

import ctypes
import queue
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

HANG_LIMIT_S = 30.0  # a hung call returns after this even if the test forgets to release it
MIB = 1024 * 1024
RESERVED_MIB = 512  # what nvmlMemory_v2 excludes from "used" and v1 includes


@dataclass
class FakeGpu:
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    link_states: list[int] = field(default_factory=list)  # per link; [] = no NVLink (PCIe card)
    crc_dl: dict[int, int] = field(default_factory=dict)  # per link
    crc_flit: dict[int, int] = field(default_factory=dict)
    crc_data: dict[int, int] = field(default_factory=dict)
    replay: dict[int, int] = field(default_factory=dict)  # per link
    recovery: dict[int, int] = field(default_factory=dict)
    util: tuple[int, int] = (80, 40)
    mem_used_mib: int = 1024
    mem_total_mib: int = 81559
    power_mw: int = 350_000
    energy_mj: int = 123_456_789
    temp_c: int = 61
    sm_clock_mhz: int = 1980
    clock_event_reasons: int = 0
    ecc_sbe: int = 5
    ecc_dbe: int = 0
    remap: tuple[int, int, int, int] | None = (2, 0, 0, 0)  # cor, unc, pending, failure
    retired_pending: int | None = None  # page retirement: before Ampere only
    retired: tuple[int, int] | None = None  # pages retired (sbe, dbe): before Ampere only
    remap_histogram: tuple[int, int, int, int, int] = (640, 0, 0, 0, 0)  # max .. none
    pcie_replays: int = 3
    recovery_action: int = 0
    processes: int = 1
    mig_mode: int | None = 0  # None: MIG not supported
    unsupported_fields: set[int] = field(default_factory=set)
    fail_calls: dict[str, int] = field(default_factory=dict)  # function -> NVML error code
    fail_fields: dict[int, int] = field(default_factory=dict)  # field id -> NVML error code
    lost: bool = False
    unknown: bool = False  # every call and field: NVML_ERROR_UNKNOWN
    hang: threading.Event | None = None
    readable: bool = True  # False: handle and UUID lookups fail (unreadable at enumeration)
    minor: int | None = None  # its /dev/nvidia<minor>; None: its index, as on most nodes


class FakeNvml:
    def __init__(self, binding: ModuleType, gpus: list[FakeGpu]) -> None:
        self.nv = binding
        self.gpus = gpus
        self.driver_lacks: set[str] = set()
        self.event_set_error: int | None = None
        self.wait_errors: list[int] = []
        self.events: queue.Queue[tuple[int, int, int]] = queue.Queue()  # gpu, type, data
        self.calls: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._structs: list[Any] = []  # one device struct per GPU index, kept alive

    # -- building the module ---------------------------------------------------------------

    def module(self) -> ModuleType:
        nv = self.nv
        mod = ModuleType("pynvml")
        for name in dir(nv):
            value = getattr(nv, name)
            if not callable(value) or isinstance(value, type):
                setattr(mod, name, value)  # constants, error classes, structures
        for name in dir(self):
            if name.startswith("nvml") and hasattr(nv, name):
                setattr(mod, name, self._wrap(name, getattr(self, name)))
        return mod

    def _wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self.calls[name] += 1
            gpu = self._gpu_of(args[0]) if args else None
            if gpu is not None:
                self._faults(name, gpu)
            if name in self.driver_lacks:
                raise self.nv.NVMLError(self.nv.NVML_ERROR_FUNCTION_NOT_FOUND)
            return fn(*args, **kwargs)

        call.__name__ = name
        return call

    def _faults(self, name: str, gpu: FakeGpu) -> None:
        nv = self.nv
        if gpu.hang is not None:
            gpu.hang.wait(HANG_LIMIT_S)
        if gpu.lost:
            raise nv.NVMLError(nv.NVML_ERROR_GPU_IS_LOST)
        if gpu.unknown:
            raise nv.NVMLError(nv.NVML_ERROR_UNKNOWN)
        if name in gpu.fail_calls:
            raise nv.NVMLError(gpu.fail_calls[name])

    def handle(self, index: int) -> Any:
        while len(self._structs) <= index:
            self._structs.append(self.nv.struct_c_nvmlDevice_t())
        return self.nv.c_nvmlDevice_t(self._structs[index])

    def _gpu_of(self, handle: Any) -> FakeGpu | None:
        if not isinstance(handle, self.nv.c_nvmlDevice_t):
            return None
        address = ctypes.cast(handle, ctypes.c_void_p).value
        for index, struct in enumerate(self._structs):
            if ctypes.addressof(struct) == address:
                return self.gpus[index]
        raise self.nv.NVMLError(self.nv.NVML_ERROR_INVALID_ARGUMENT)

    def gpu(self, handle: Any) -> FakeGpu:
        gpu = self._gpu_of(handle)
        assert gpu is not None
        return gpu

    def post_event(self, index: int, event_type: int, data: int = 0) -> None:
        self.events.put((index, event_type, data))

    # -- system ----------------------------------------------------------------------------

    def nvmlInit(self) -> None: ...

    def nvmlShutdown(self) -> None: ...

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.54.15"

    def nvmlSystemGetNVMLVersion(self) -> str:
        return "12.550.54.15"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12040

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        if not self.gpus[index].readable:
            raise self.nv.NVMLError(self.nv.NVML_ERROR_UNKNOWN)
        return self.handle(index)

    # -- device ----------------------------------------------------------------------------

    def nvmlDeviceGetUUID(self, h: Any) -> str:
        return self.gpu(h).uuid

    def nvmlDeviceGetName(self, h: Any) -> str:
        return self.gpu(h).name

    def nvmlDeviceGetMinorNumber(self, h: Any) -> int:
        gpu = self.gpu(h)
        return self.gpus.index(gpu) if gpu.minor is None else gpu.minor

    def nvmlDeviceGetUtilizationRates(self, h: Any) -> Any:
        gpu, memory = self.gpu(h).util
        return self.nv.c_nvmlUtilization_t(gpu=gpu, memory=memory)

    def nvmlDeviceGetMemoryInfo(self, h: Any, version: int | None = None) -> Any:
        g = self.gpu(h)
        if version:
            if "nvmlDeviceGetMemoryInfo_v2" in self.driver_lacks:
                raise self.nv.NVMLError(self.nv.NVML_ERROR_FUNCTION_NOT_FOUND)
            info = self.nv.c_nvmlMemory_v2_t()
            info.used = g.mem_used_mib * MIB
            info.reserved = RESERVED_MIB * MIB
        else:
            info = self.nv.c_nvmlMemory_t()
            info.used = (g.mem_used_mib + RESERVED_MIB) * MIB
        info.total = g.mem_total_mib * MIB
        return info

    def nvmlDeviceGetPowerUsage(self, h: Any) -> int:
        return self.gpu(h).power_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, h: Any) -> int:
        return self.gpu(h).energy_mj

    def nvmlDeviceGetTemperatureV(self, h: Any, sensor: int, version: int = 0) -> int:
        return self.gpu(h).temp_c

    def nvmlDeviceGetTemperature(self, h: Any, sensor: int) -> int:
        return self.gpu(h).temp_c

    def nvmlDeviceGetClockInfo(self, h: Any, clock: int) -> int:
        return self.gpu(h).sm_clock_mhz

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: Any) -> int:
        return self.gpu(h).clock_event_reasons

    def nvmlDeviceGetComputeRunningProcesses(self, h: Any) -> list[Any]:
        if "nvmlDeviceGetComputeRunningProcesses_v3" in self.driver_lacks:
            raise self.nv.NVMLLibraryMismatchError("Unversioned function called ...")
        return self.nvmlDeviceGetComputeRunningProcesses_v2(h)

    def nvmlDeviceGetComputeRunningProcesses_v2(self, h: Any) -> list[Any]:
        return [object() for _ in range(self.gpu(h).processes)]

    def nvmlDeviceGetTotalEccErrors(self, h: Any, error_type: int, counter: int) -> int:
        g = self.gpu(h)
        return g.ecc_sbe if error_type == self.nv.NVML_MEMORY_ERROR_TYPE_CORRECTED else g.ecc_dbe

    def nvmlDeviceGetRemappedRows(self, h: Any) -> tuple[int, int, int, int]:
        remap = self.gpu(h).remap
        if remap is None:
            raise self.nv.NVMLError(self.nv.NVML_ERROR_NOT_SUPPORTED)
        return remap

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: Any) -> int:
        pending = self.gpu(h).retired_pending
        if pending is None:
            raise self.nv.NVMLError(self.nv.NVML_ERROR_NOT_SUPPORTED)
        return pending

    def nvmlDeviceGetRowRemapperHistogram(self, h: Any) -> Any:
        g = self.gpu(h)
        if g.remap is None:
            raise self.nv.NVMLError(self.nv.NVML_ERROR_NOT_SUPPORTED)
        values = self.nv.c_nvmlRowRemapperHistogramValues()
        values.max, values.high, values.partial, values.low, values.none = g.remap_histogram
        return values

    def nvmlDeviceGetNvLinkState(self, h: Any, link: int) -> int:
        states = self.gpu(h).link_states
        if not 0 <= link < len(states):
            raise self.nv.NVMLError(self.nv.NVML_ERROR_INVALID_ARGUMENT)
        return states[link]

    def nvmlDeviceGetMigMode(self, h: Any) -> list[int]:
        mode = self.gpu(h).mig_mode
        if mode is None:
            raise self.nv.NVMLError(self.nv.NVML_ERROR_NOT_SUPPORTED)
        return [mode, mode]

    def nvmlDeviceGetFieldValues(self, h: Any, field_ids: list[Any]) -> Any:
        g = self.gpu(h)
        values = (self.nv.c_nvmlFieldValue_t * len(field_ids))()
        for i, requested in enumerate(field_ids):
            fid, scope = requested if isinstance(requested, tuple) else (requested, 0)
            values[i].fieldId, values[i].scopeId = fid, scope
            code, value = self._field(g, fid, scope)
            values[i].nvmlReturn = code
            values[i].valueType = self.nv.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
            values[i].value.ullVal = value
        return values

    def _field(self, g: FakeGpu, fid: int, scope: int) -> tuple[int, int]:
        nv = self.nv
        if g.unknown:
            return nv.NVML_ERROR_UNKNOWN, 0
        if fid in g.fail_fields:
            return g.fail_fields[fid], 0
        value = None if fid in g.unsupported_fields else self._field_value(g, fid, scope)
        if value is None:
            return nv.NVML_ERROR_NOT_SUPPORTED, 0
        return nv.NVML_SUCCESS, value

    def _field_value(self, g: FakeGpu, fid: int, scope: int) -> int | None:
        nv = self.nv
        links = len(g.link_states)
        per_link: dict[int, dict[int, int] | list[int]] = {
            nv.NVML_FI_DEV_NVLINK_ERROR_DL_CRC: g.crc_dl,
            nv.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL: g.crc_flit,
            nv.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL: g.crc_data,
            nv.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL: g.replay,
            nv.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL: g.recovery,
            nv.NVML_FI_DEV_NVLINK_GET_STATE: g.link_states,
        }
        if fid in per_link:
            if not 0 <= scope < links:
                return None
            counts = per_link[fid]
            return counts[scope] if isinstance(counts, list) else counts.get(scope, 0)
        remap = g.remap or (None, None, None, None)
        retired = g.retired or (None, None)
        device: dict[int, int | None] = {
            nv.NVML_FI_DEV_ECC_SBE_VOL_TOTAL: g.ecc_sbe,
            nv.NVML_FI_DEV_ECC_DBE_VOL_TOTAL: g.ecc_dbe,
            nv.NVML_FI_DEV_PCIE_REPLAY_COUNTER: g.pcie_replays,
            nv.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION: g.energy_mj,
            nv.NVML_FI_DEV_NVLINK_LINK_COUNT: links or None,
            nv.NVML_FI_DEV_REMAPPED_COR: remap[0],
            nv.NVML_FI_DEV_REMAPPED_UNC: remap[1],
            nv.NVML_FI_DEV_REMAPPED_PENDING: remap[2],
            nv.NVML_FI_DEV_REMAPPED_FAILURE: remap[3],
            nv.NVML_FI_DEV_RETIRED_PENDING: g.retired_pending,
            nv.NVML_FI_DEV_RETIRED_SBE: retired[0],
            nv.NVML_FI_DEV_RETIRED_DBE: retired[1],
        }
        recovery = getattr(nv, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", None)
        if recovery is not None:
            device[recovery] = g.recovery_action
        return device.get(fid)

    # -- events ----------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> Any:
        if self.event_set_error is not None:
            raise self.nv.NVMLError(self.event_set_error)
        return self.nv.c_nvmlEventSet_t()

    def nvmlDeviceGetSupportedEventTypes(self, h: Any) -> int:
        self.gpu(h)
        return int(self.nv.nvmlEventTypeAll)

    def nvmlDeviceRegisterEvents(self, h: Any, mask: int, event_set: Any) -> None:
        self.gpu(h)

    def nvmlEventSetWait_v2(self, event_set: Any, timeout_ms: int) -> Any:
        if self.wait_errors:
            raise self.nv.NVMLError(self.wait_errors.pop(0))
        try:
            index, event_type, data = self.events.get(timeout=min(timeout_ms, 20) / 1000)
        except queue.Empty:
            raise self.nv.NVMLError(self.nv.NVML_ERROR_TIMEOUT) from None
        event = self.nv.c_nvmlEventData_t()
        event.device = self.handle(index)  # a new pointer object, as the binding returns
        event.eventType, event.eventData = event_type, data
        return event

    def nvmlEventSetFree(self, event_set: Any) -> None: ...
