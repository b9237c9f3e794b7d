"""XID and double-bit ECC events from an NVML event set, waited on in a background thread.

``nvmlEventSetWait_v2`` blocks, so it runs off the 1 Hz loop; events queue per GPU UUID and the
sampler drains them into the next reading. Each registered handle is mapped to its UUID at
registration: an XID 79 comes from a GPU that no longer answers ``nvmlDeviceGetUUID``. Wait
errors other than a timeout reach every GPU's reading as ``event_errors`` (once per distinct
error), so the service sees that XIDs may be missing.
"""

from __future__ import annotations

import ctypes
import threading
from collections import defaultdict
from types import ModuleType
from typing import Any

from metering_agent.logs import Log
from metering_agent.nvml.provider import GpuReading

WAIT_MS = 500  # bounds how long stop() waits for the thread
MAX_QUEUED = 1024  # per GPU; the sampler drains every second, so only a stalled sampler fills it
ERROR_BACKOFF_S = 1.0  # don't spin on a persistent wait error

log = Log("metering_agent.xid")


def handle_key(handle: Any) -> int:
    """The device's address: the binding returns a new pointer object with every event."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value or 0
    except (TypeError, ctypes.ArgumentError):
        return id(handle)


class XidWatcher:
    def __init__(self, nv: ModuleType) -> None:
        self._nv = nv
        self._lock = threading.Lock()
        self._uuids: dict[int, str] = {}
        self._xids: dict[str, list[int]] = defaultdict(list)
        self._dbe: dict[str, int] = defaultdict(int)
        self._errors: dict[str, list[str]] = defaultdict(list)
        self._last_error: str | None = None
        self._stop = threading.Event()
        self._event_set = nv.nvmlEventSetCreate()  # raises: the caller samples without XIDs
        self._mask = nv.nvmlEventTypeXidCriticalError | nv.nvmlEventTypeDoubleBitEccError
        self._thread = threading.Thread(target=self._run, name="nvml-events", daemon=True)

    def start(self) -> None:
        """Start waiting, once the GPUs present at start are registered."""
        self._thread.start()

    def register(self, uuid: str, handle: Any) -> str | None:
        """Watch this GPU; returns why its events cannot be watched, or None."""
        nv = self._nv
        with self._lock:
            self._uuids[handle_key(handle)] = uuid
        try:
            mask = nv.nvmlDeviceGetSupportedEventTypes(handle) & self._mask
            nv.nvmlDeviceRegisterEvents(handle, mask, self._event_set)
        except nv.NVMLError as e:
            log.warning("xid_events_unsupported", uuid=uuid, error=str(e))
            return str(e)
        return None

    def _run(self) -> None:
        nv = self._nv
        while not self._stop.is_set():
            try:
                data = nv.nvmlEventSetWait_v2(self._event_set, WAIT_MS)
            except Exception as e:  # NVMLError or worse: either way XIDs may be going missing
                if isinstance(e, nv.NVMLError) and e.value == nv.NVML_ERROR_TIMEOUT:
                    self._last_error = None
                    continue
                self._wait_failed(f"nvmlEventSetWait_v2 failed: {e or type(e).__name__}")
                self._stop.wait(ERROR_BACKOFF_S)
                continue
            self._last_error = None
            self._record(data.device, int(data.eventType), int(data.eventData))

    def _wait_failed(self, message: str) -> None:
        if message == self._last_error:
            return
        self._last_error = message
        log.error("xid_wait_failed", error=message)
        with self._lock:
            for uuid in self._uuids.values():
                self._queue_error(uuid, message)

    def _record(self, device: Any, event_type: int, event_data: int) -> None:
        nv = self._nv
        with self._lock:
            uuid = self._uuids.get(handle_key(device))
            if uuid is None:
                message = f"event 0x{event_type:x} (data {event_data}) from an unregistered GPU"
                log.error("xid_unattributed", event_type=event_type, event_data=event_data)
                for known in self._uuids.values():
                    self._queue_error(known, message)
                return
            if event_type & nv.nvmlEventTypeXidCriticalError:
                if len(self._xids[uuid]) < MAX_QUEUED:
                    self._xids[uuid].append(event_data)
                else:
                    self._queue_error(uuid, f"XID {event_data} dropped: event queue full")
            if event_type & nv.nvmlEventTypeDoubleBitEccError:
                self._dbe[uuid] += 1

    def _queue_error(self, uuid: str, message: str) -> None:
        errors = self._errors[uuid]
        if len(errors) < MAX_QUEUED and message not in errors:
            errors.append(message)

    def drain_into(self, r: GpuReading) -> None:
        with self._lock:
            r.xids.extend(self._xids.pop(r.uuid, []))
            r.dbe_events += self._dbe.pop(r.uuid, 0)
            r.event_errors.extend(self._errors.pop(r.uuid, []))

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2 * WAIT_MS / 1000 + ERROR_BACKOFF_S)
        try:
            self._nv.nvmlEventSetFree(self._event_set)
        except self._nv.NVMLError as e:
            log.warning("xid_event_set_free_failed", error=str(e))
