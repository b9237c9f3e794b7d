"""XID and double-bit ECC events from an NVML event set, waited on in a background thread.

``nvmlEventSetWait_v2`` blocks, so it runs off the 1 Hz loop; events queue per GPU UUID and the
sampler drains them into the next reading.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from types import ModuleType
from typing import Any

from metering_agent.collectors.base import text
from metering_agent.logs import Log
from metering_agent.nvml.provider import GpuReading

WAIT_MS = 500  # bounds how long stop() waits for the thread

log = Log("metering_agent.xid")


class XidWatcher:
    def __init__(self, nv: ModuleType, handles: dict[str, Any]) -> None:
        self._nv = nv
        self._lock = threading.Lock()
        self._xids: dict[str, list[int]] = defaultdict(list)
        self._dbe: dict[str, int] = defaultdict(int)
        self._stop = threading.Event()
        self._event_set = nv.nvmlEventSetCreate()
        self._mask = nv.nvmlEventTypeXidCriticalError | nv.nvmlEventTypeDoubleBitEccError
        for uuid, handle in handles.items():
            self._register(uuid, handle)
        self._thread = threading.Thread(target=self._run, name="nvml-events", daemon=True)
        self._thread.start()

    def _register(self, uuid: str, handle: Any) -> None:
        nv = self._nv
        try:
            mask = nv.nvmlDeviceGetSupportedEventTypes(handle) & self._mask
            nv.nvmlDeviceRegisterEvents(handle, mask, self._event_set)
        except nv.NVMLError as e:
            log.warning("xid_events_unsupported", uuid=uuid, error=str(e))

    def _run(self) -> None:
        nv = self._nv
        while not self._stop.is_set():
            try:
                data = nv.nvmlEventSetWait_v2(self._event_set, WAIT_MS)
                # The same spelling as the reading's UUID, so queued XIDs find their GPU.
                uuid = text(nv.nvmlDeviceGetUUID(data.device))
            except nv.NVMLError as e:
                if e.value != nv.NVML_ERROR_TIMEOUT:
                    log.warning("xid_wait_failed", error=str(e))
                    self._stop.wait(1.0)  # don't spin on a persistent error
                continue
            self._record(uuid, int(data.eventType), int(data.eventData))

    def _record(self, uuid: str, event_type: int, event_data: int) -> None:
        with self._lock:
            if event_type & self._nv.nvmlEventTypeXidCriticalError:
                self._xids[uuid].append(event_data)
            if event_type & self._nv.nvmlEventTypeDoubleBitEccError:
                self._dbe[uuid] += 1

    def drain_into(self, r: GpuReading) -> None:
        with self._lock:
            r.xids.extend(self._xids.pop(r.uuid, []))
            r.dbe_events += self._dbe.pop(r.uuid, 0)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2 * WAIT_MS / 1000)
        try:
            self._nv.nvmlEventSetFree(self._event_set)
        except self._nv.NVMLError as e:
            log.warning("xid_event_set_free_failed", error=str(e))
