"""The real provider: pynvml, imported lazily so the simulator runs where NVML is absent.

Each GPU is sampled on its own worker thread, within ``sample_timeout_s``: an NVML call that
hangs on one GPU makes that GPU's reading "lost" (with the call's age as the reason) while the
others are sampled as usual; a worker still stuck at the next tick is not given more work. GPUs
are enumerated again every ``enumerate_every_s``: a GPU unreadable at start, a new one, or one
back after a reset is picked up (a returning GPU counts as reset: latched faults clear).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from types import ModuleType
from typing import Any, Generic, TypeVar

from metering_agent.collectors import FAST, SLOW, SLOW_ATTRS, SLOW_INTERVAL_S, Collector
from metering_agent.collectors.base import DeviceState, GpuLost, Sample, text
from metering_agent.collectors.xid import XidWatcher
from metering_agent.logs import Log
from metering_agent.nvml.provider import GpuInfo, GpuReading

SAMPLE_TIMEOUT_S = 0.8  # the 1 Hz loop's budget for one GPU's calls
ENUMERATE_EVERY_S = 30.0
UNKNOWN_LOST_AFTER = 3  # samples in a row where every call failed with NVML_ERROR_UNKNOWN
PROBE_TIMEOUT_S = 10.0

log = Log("metering_agent.nvml")
T = TypeVar("T")
Found = list[tuple[GpuInfo, Any]]  # (GPU, handle) per readable index


class NvmlUnavailable(Exception):
    """No NVML on this node: the binding or the driver's library is missing, or no driver."""


INSTALL_HINT = (
    "install the NVIDIA driver (it provides libnvidia-ml.so.1) and the binding"
    " (pip install 'nvidia-ml-py>=12.560.30'), or run with --simulate N"
)


def load_nvml() -> ModuleType:
    """pynvml, initialised; ``NvmlUnavailable`` saying what is missing otherwise."""
    try:
        nv = importlib.import_module("pynvml")
    except ImportError as e:
        raise NvmlUnavailable(f"the Python binding nvidia-ml-py is not installed ({e})") from e
    try:
        nv.nvmlInit()
    except nv.NVMLError as e:
        raise NvmlUnavailable(f"{e} (libnvidia-ml.so.1 could not be used)") from e
    return nv


class _Worker(Generic[T]):
    """A daemon thread doing one job at a time: a hung NVML call holds only this worker."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.Queue[Callable[[], T] | None] = queue.Queue(maxsize=1)
        self._done = threading.Event()
        self._done.set()
        self._result: T | None = None
        self.started = 0.0
        threading.Thread(target=self._run, name=name, daemon=True).start()

    @property
    def busy(self) -> bool:
        return not self._done.is_set()

    def submit(self, job: Callable[[], T]) -> None:
        self._result = None
        self._done.clear()
        self.started = time.monotonic()
        self._jobs.put_nowait(job)

    def result(self, timeout_s: float) -> T | None:
        """The job's result once it is done (within ``timeout_s``), else None."""
        return self._result if self._done.wait(max(0.0, timeout_s)) else None

    def take(self) -> T | None:
        """The finished job's result, once: None while busy or when already taken."""
        result, self._result = (None, self._result) if self.busy else (self._result, None)
        return result

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            try:
                self._result = job()
            finally:
                self._done.set()

    def stop(self) -> None:
        if not self.busy:
            self._jobs.put_nowait(None)


@dataclass(slots=True)
class _Device:
    info: GpuInfo
    handle: Any
    worker: _Worker[GpuReading]
    state: DeviceState = field(default_factory=DeviceState)
    next_slow: float = 0.0
    unknown_streak: int = 0
    lost: bool = False  # the last finished sample found the GPU lost
    events_unsupported: str | None = None
    failed_collectors: set[str] = field(default_factory=set)  # logged once each
    calls: int = 0
    hung_logged: bool = False
    mig_logged: bool = False


class NvmlProvider:
    def __init__(
        self,
        nv: ModuleType | None = None,
        *,
        watch_events: bool = True,
        clock: Callable[[], float] = time.monotonic,
        sample_timeout_s: float = SAMPLE_TIMEOUT_S,
        slow_interval_s: float = SLOW_INTERVAL_S,
        enumerate_every_s: float = ENUMERATE_EVERY_S,
    ) -> None:
        if nv is None:
            nv = load_nvml()
        else:
            nv.nvmlInit()
        self._nv = nv
        self._clock = clock
        self._timeout = sample_timeout_s
        self._slow_every = slow_interval_s
        self._enumerate_every = enumerate_every_s
        self._devices: dict[str, _Device] = {}
        self._unreadable: dict[int, str] = {}  # index -> error, logged when it changes
        self.enumeration_calls = 0
        self._events: XidWatcher | None = None
        self.events_unavailable: str | None = None
        if watch_events:
            try:
                self._events = XidWatcher(self._nv)
            except Exception as e:  # any failure: meter without XIDs, and say so
                self.events_unavailable = f"XID events unavailable: {e or type(e).__name__}"
                log.error("xid_events_unavailable", error=self.events_unavailable)
        # Enumeration after start runs on its own worker: a GPU hanging in it stalls nothing.
        self._enumerator: _Worker[Found] = _Worker("nvml-enumerate")
        self._next_enumerate = self._clock() + self._enumerate_every
        for info, handle in self._discover():
            self._adopt(info, handle)
        if self._events is not None:
            self._events.start()

    def _discover(self) -> Found:
        nv = self._nv
        found: Found = []
        try:
            self.enumeration_calls += 1
            count = nv.nvmlDeviceGetCount()
        except nv.NVMLError as e:
            log.error("gpu_enumeration_failed", error=str(e))
            return found
        for index in range(count):
            try:
                self.enumeration_calls += 4
                handle = nv.nvmlDeviceGetHandleByIndex(index)
                info = GpuInfo(
                    index,
                    text(nv.nvmlDeviceGetUUID(handle)),
                    text(nv.nvmlDeviceGetName(handle)),
                    _minor_number(nv, handle),
                )
            except nv.NVMLError as e:
                # Without a UUID there is nothing to report the GPU under; retried every
                # enumeration, so it is metered from the moment it answers.
                if self._unreadable.get(index) != str(e):
                    log.error(
                        "gpu_unreadable", index=index, error=str(e), retry_s=self._enumerate_every
                    )
                self._unreadable[index] = str(e)
                continue
            self._unreadable.pop(index, None)
            found.append((info, handle))
        return found

    def _refresh_gpus(self, now: float) -> None:
        """Adopt what the last enumeration found; start the next one when it is due."""
        if self._enumerator.busy:
            return
        if now >= self._next_enumerate:
            self._next_enumerate = now + self._enumerate_every
            self._enumerator.submit(self._discover)
            self._enumerator.result(self._timeout)  # usually done at once: adopt this tick
        for info, handle in self._enumerator.take() or []:
            self._adopt(info, handle)

    def _adopt(self, info: GpuInfo, handle: Any) -> None:
        device = self._devices.get(info.uuid)
        if device is not None and not device.lost:
            return
        if device is None:
            device = self._devices[info.uuid] = _Device(info, handle, _Worker(f"nvml-{info.index}"))
            log.info("gpu_found", index=info.index, uuid=info.uuid, name=info.name)
        else:
            device.handle, device.info = handle, info  # back after a reset: a fresh handle
            log.info("gpu_handle_renewed", index=info.index, uuid=info.uuid)
        if self._events is not None:
            device.events_unsupported = self._events.register(info.uuid, handle)

    def gpus(self) -> list[GpuInfo]:
        return [device.info for device in self._devices.values()]

    def nvml_calls(self) -> int:
        """NVML calls made so far by sampling and enumeration (not the event thread)."""
        return self.enumeration_calls + sum(d.calls for d in self._devices.values())

    def read_all(self) -> list[GpuReading]:
        now = self._clock()
        self._refresh_gpus(now)
        devices = list(self._devices.values())
        for device in devices:
            if not device.worker.busy:
                device.worker.submit(partial(self._sample, device, now))
        deadline = time.monotonic() + self._timeout
        return [self._collect_result(d, deadline - time.monotonic()) for d in devices]

    def _collect_result(self, device: _Device, timeout_s: float) -> GpuReading:
        r = device.worker.result(timeout_s)
        if r is not None:
            device.hung_logged = False
            return r
        age = time.monotonic() - device.worker.started
        info = device.info
        r = GpuReading(info.index, info.uuid, info.name, info.minor, lost=True)
        r.lost_reason = f"NVML has not answered for {age:.1f} s (limit {self._timeout} s)"
        if not device.hung_logged:
            log.error("gpu_sample_hung", uuid=info.uuid, waited_s=round(age, 1))
            device.hung_logged = True
        if self._events is not None:
            self._events.drain_into(r)
        return r

    def _sample(self, device: _Device, now: float, trace: list[Any] | None = None) -> GpuReading:
        info = device.info
        r = GpuReading(info.index, info.uuid, info.name, info.minor)
        s = Sample(self._nv, device.handle, r, device.state, trace=trace)
        try:
            self._read_signals(device, s, now, force_slow=trace is not None)
        except GpuLost as e:
            # Keep the GPU's identity, drop the partial readings: it is failed, not idle.
            r = GpuReading(
                info.index, info.uuid, info.name, info.minor, lost=True, lost_reason=str(e)
            )
        device.calls += s.calls
        if not r.lost:
            r = self._unknown_bound(device, s, r)
        self._note_reset(device, r)
        if r.mig_enabled and not device.mig_logged:
            log.info("mig_enabled", uuid=info.uuid, metering="whole GPU; MIG slices not metered")
            device.mig_logged = True
        if self._events is None:
            r.unsupported["xid_events"] = self.events_unavailable or "not watched"
        else:
            if device.events_unsupported is not None:
                r.unsupported["xid_events"] = device.events_unsupported
            self._events.drain_into(r)
        return r

    def _read_signals(self, device: _Device, s: Sample, now: float, force_slow: bool) -> None:
        state, r = device.state, s.reading
        if force_slow or now >= device.next_slow:
            before = set(r.unsupported)
            for collect in SLOW:
                self._run(collect, device, s)
            state.slow.update({attr: getattr(r, attr) for attr in SLOW_ATTRS})
            state.slow_unsupported = {k: v for k, v in r.unsupported.items() if k not in before}
            device.next_slow = now + self._slow_every
        else:
            for attr in SLOW_ATTRS:
                setattr(r, attr, state.slow.get(attr))
            r.unsupported.update(state.slow_unsupported)
        for collect in FAST:
            self._run(collect, device, s)

    def _run(self, collect: Collector, device: _Device, s: Sample) -> None:
        """One collector's unexpected failure marks its signal unsupported, not the whole GPU."""
        try:
            collect(s)
        except GpuLost:
            raise
        except Exception as e:  # e.g. NVMLLibraryMismatchError, a binding bug
            name = collect.__module__.rsplit(".", 1)[-1]
            s.reading.unsupported[name] = f"{type(e).__name__}: {e}"
            if name not in device.failed_collectors:
                device.failed_collectors.add(name)
                log.error("collector_failed", uuid=device.info.uuid, collector=name, error=repr(e))

    def _unknown_bound(self, device: _Device, s: Sample, r: GpuReading) -> GpuReading:
        """NVML_ERROR_UNKNOWN from every call is a GPU in trouble, not a healthy idle one."""
        if s.succeeded or not s.unknown:
            device.unknown_streak = 0
            return r
        device.unknown_streak += 1
        if device.unknown_streak < UNKNOWN_LOST_AFTER:
            return r
        info = device.info
        reason = f"every NVML call failed with Unknown Error for {device.unknown_streak} samples"
        return GpuReading(
            info.index, info.uuid, info.name, info.minor, lost=True, lost_reason=reason
        )

    def _note_reset(self, device: _Device, r: GpuReading) -> None:
        """A lost GPU answering again was reset (the classifier sees the other repair signals
        in the readings themselves: ``classifier.REPAIR_SIGNALS``)."""
        r.recovered = device.lost and not r.lost
        device.lost = r.lost

    def probe_gpus(self) -> list[dict[str, Any]]:
        """Every call and its result or error, with its duration, per GPU."""
        out = []
        for device in self._devices.values():
            trace: list[Any] = []
            if device.worker.busy:
                out.append({"index": device.info.index, "uuid": device.info.uuid, "hung": True})
                continue
            device.worker.submit(partial(self._sample, device, self._clock(), trace))
            r = device.worker.result(PROBE_TIMEOUT_S)
            entry: dict[str, Any] = asdict(device.info)
            if r is None:
                entry["error"] = f"NVML did not answer within {PROBE_TIMEOUT_S} s"
            else:
                entry["metering"] = (
                    "whole GPU (MIG mode is on; MIG slices are not metered separately)"
                    if r.mig_enabled
                    else "whole GPU"
                )
                entry["reading"] = asdict(r)
            entry["calls"] = [asdict(c) for c in trace]
            out.append(entry)
        return out

    def close(self) -> None:
        if self._events is not None:
            self._events.stop()
        workers: list[_Worker[Any]] = [self._enumerator]
        workers += [device.worker for device in self._devices.values()]
        for worker in workers:
            worker.stop()
        if any(worker.busy for worker in workers):
            log.error("nvml_shutdown_skipped", reason="an NVML call is still hung")
            return
        self._nv.nvmlShutdown()

    def system_info(self) -> dict[str, Any]:
        """Driver, NVML and binding versions, each or the error that stopped it."""
        return _system_info(self._nv)


def _system_info(nv: ModuleType) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, fn_name in (
        ("driver_version", "nvmlSystemGetDriverVersion"),
        ("nvml_version", "nvmlSystemGetNVMLVersion"),
        ("cuda_driver_version", "nvmlSystemGetCudaDriverVersion"),
    ):
        try:
            value = getattr(nv, fn_name)()
            out[key] = text(value) if isinstance(value, str | bytes) else value
        except Exception as e:  # the probe reports, never stops
            out[key] = f"error: {e or type(e).__name__}"
    try:
        out["nvidia_ml_py"] = importlib.metadata.version("nvidia-ml-py")
    except importlib.metadata.PackageNotFoundError:
        out["nvidia_ml_py"] = None
    return out


def probe(nv: ModuleType | None = None) -> dict[str, Any]:
    """What every NVML call returned for each GPU, or why it did not ("Not Supported", ...)."""
    provider = NvmlProvider(nv, watch_events=False)
    try:
        system = provider.system_info()
        gpus = [{**system, **gpu} for gpu in provider.probe_gpus()]
        return {**system, "gpus": gpus}
    finally:
        provider.close()


def _minor_number(nv: Any, handle: Any) -> int | None:
    """The device's minor number (/dev/nvidia<minor>), how a scheduler's device files name the
    GPU; None where the driver does not say (a missing minor costs the GPU its scheduler
    identity, not its metering)."""
    try:
        return int(nv.nvmlDeviceGetMinorNumber(handle))
    except nv.NVMLError as e:
        log.debug("gpu_minor_number_unavailable", error=str(e))
        return None
