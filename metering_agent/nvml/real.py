"""The real provider: pynvml, imported lazily so the simulator runs where NVML is absent."""

from __future__ import annotations

import importlib
from dataclasses import asdict
from types import ModuleType
from typing import Any

from metering_agent.collectors import COLLECTORS
from metering_agent.collectors.base import GpuLost, text
from metering_agent.collectors.xid import XidWatcher
from metering_agent.logs import Log
from metering_agent.nvml.provider import GpuInfo, GpuReading

log = Log("metering_agent.nvml")


class NvmlProvider:
    def __init__(self, nv: ModuleType | None = None, *, watch_events: bool = True) -> None:
        self._nv = nv or importlib.import_module("pynvml")
        self._nv.nvmlInit()
        self._devices: list[tuple[GpuInfo, Any]] = []
        for index in range(self._nv.nvmlDeviceGetCount()):
            try:
                handle = self._nv.nvmlDeviceGetHandleByIndex(index)
                info = GpuInfo(
                    index,
                    text(self._nv.nvmlDeviceGetUUID(handle)),
                    text(self._nv.nvmlDeviceGetName(handle)),
                )
            except self._nv.NVMLError as e:
                # Without a UUID there is nothing to report the GPU under; the service sees it
                # go silent (unmetered), and the operator sees this error.
                log.error("gpu_unreadable_at_start", index=index, error=str(e))
                continue
            self._devices.append((info, handle))
        handles = {info.uuid: handle for info, handle in self._devices}
        self._events = XidWatcher(self._nv, handles) if watch_events else None

    def gpus(self) -> list[GpuInfo]:
        return [info for info, _ in self._devices]

    def read_all(self) -> list[GpuReading]:
        return [self._read(info, handle) for info, handle in self._devices]

    def _read(self, info: GpuInfo, handle: Any) -> GpuReading:
        r = GpuReading(info.index, info.uuid, info.name)
        try:
            for collect in COLLECTORS:
                collect(self._nv, handle, r)
        except GpuLost as e:
            # Keep the GPU's identity, drop the partial readings: it is failed, not idle.
            r = GpuReading(info.index, info.uuid, info.name, lost=True, lost_reason=str(e))
        if self._events is not None:
            self._events.drain_into(r)
        return r

    def close(self) -> None:
        if self._events is not None:
            self._events.stop()
        self._nv.nvmlShutdown()


def probe(nv: ModuleType | None = None) -> list[dict[str, Any]]:
    """What every NVML call returned for each GPU, or why it did not ("Not Supported", ...)."""
    provider = NvmlProvider(nv, watch_events=False)
    try:
        return [asdict(r) for r in provider.read_all()]
    finally:
        provider.close()
