"""The pynvml provider against a fake pynvml: unsupported calls and lost GPUs never crash it."""

from __future__ import annotations

import json
import sys
import time
from types import ModuleType, SimpleNamespace
from typing import Any

import pynvml
import pytest

from metering_agent import cli
from metering_agent.classifier import HealthMemory, classify
from metering_agent.nvml.real import NvmlProvider, probe
from metering_agent.protocol import GpuState

NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
LOST = pynvml.NVML_ERROR_GPU_IS_LOST


class FakeNvml:
    """Just enough of pynvml: constants and error classes are the real module's."""

    def __init__(self, gpus: int = 2) -> None:
        self.gpus = gpus
        self.fail_calls: dict[tuple[str, int], int] = {}  # (function, gpu) -> NVML error code
        self.fail_fields: dict[tuple[int, int], int] = {}  # (field id, gpu) -> NVML error code
        self.events: list[SimpleNamespace] = []
        self.field_data = {
            pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT: 4,
            pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_CRC: 7,
            pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL: 1,
            pynvml.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL: 1,
            pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER: 3,
            pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: 0,
        }

    def module(self) -> ModuleType:
        mod = ModuleType("pynvml")
        for name in dir(pynvml):
            if (
                name.startswith(("NVML", "nvmlEventType", "nvmlClocksEvent"))
                and not callable(getattr(pynvml, name))
            ) or name.startswith("NVMLError"):
                setattr(mod, name, getattr(pynvml, name))
        for name in dir(self):
            if name.startswith("nvml"):
                setattr(mod, name, self._guard(name, getattr(self, name)))
        return mod

    def _guard(self, name: str, fn: Any) -> Any:
        def call(*args: Any) -> Any:
            if args and isinstance(args[0], int) and (name, args[0]) in self.fail_calls:
                raise pynvml.NVMLError(self.fail_calls[(name, args[0])])
            return fn(*args)

        return call

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int:
        return self.gpus

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return f"GPU-0000000{h}-0000-0000-0000-000000000000"

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return b"NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetUtilizationRates(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(gpu=80, memory=40)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(used=1024 * 1024**2, total=81559 * 1024**2)

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return 350_000

    def nvmlDeviceGetTotalEnergyConsumption(self, h: int) -> int:
        return 123_456_789

    def nvmlDeviceGetTemperatureV(self, h: int, sensor: int) -> int:
        return 61

    def nvmlDeviceGetClockInfo(self, h: int, clock: int) -> int:
        return 1980

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:
        return pynvml.nvmlClocksEventReasonHwThermalSlowdown

    def nvmlDeviceGetTotalEccErrors(self, h: int, error_type: int, counter: int) -> int:
        return 5 if error_type == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED else 0

    def nvmlDeviceGetRemappedRows(self, h: int) -> tuple[int, int, int, int]:
        return (2, 0, 1, 0)

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: int) -> int:
        return 0

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        return 0 if link == 3 else 1

    def nvmlDeviceGetFieldValues(self, h: int, ids: list[int]) -> list[SimpleNamespace]:
        out = []
        for fid in ids:
            ret = self.fail_fields.get((fid, h), pynvml.NVML_SUCCESS)
            value = SimpleNamespace(ullVal=self.field_data.get(fid, 0))
            out.append(SimpleNamespace(nvmlReturn=ret, valueType=3, value=value))
        return out

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[object]:
        return [object()]

    def nvmlEventSetCreate(self) -> str:
        return "event-set"

    def nvmlDeviceGetSupportedEventTypes(self, h: int) -> int:
        return pynvml.nvmlEventTypeAll

    def nvmlDeviceRegisterEvents(self, h: int, mask: int, event_set: str) -> None: ...

    def nvmlEventSetWait_v2(self, event_set: str, timeout_ms: int) -> SimpleNamespace:
        if self.events:
            return self.events.pop(0)
        time.sleep(0.01)
        raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)

    def nvmlEventSetFree(self, event_set: str) -> None: ...


@pytest.fixture
def fake() -> FakeNvml:
    return FakeNvml()


def test_reads_every_signal(fake: FakeNvml) -> None:
    provider = NvmlProvider(fake.module())
    try:
        r = provider.read_all()[0]
    finally:
        provider.close()
    assert (r.uuid, r.name) == ("GPU-00000000-0000-0000-0000-000000000000", "NVIDIA H100 80GB HBM3")
    assert (r.gpu_util, r.mem_util, r.mem_used_mib, r.mem_total_mib) == (80, 40, 1024, 81559)
    assert (r.power_mw, r.energy_mj, r.temp_c, r.sm_clock_mhz) == (350_000, 123_456_789, 61, 1980)
    assert r.clock_event_reasons == pynvml.nvmlClocksEventReasonHwThermalSlowdown
    assert (r.ecc_corrected_volatile, r.ecc_uncorrected_volatile) == (5, 0)
    assert (r.remap_pending, r.remap_failure, r.retired_pages_pending) == (True, False, False)
    assert (r.nvlink_links, r.nvlink_links_down, r.nvlink_crc_errors) == (4, 1, 7)
    assert (r.pcie_replays, r.recovery_action, r.process_count) == (3, 0, 1)
    assert r.unsupported == {} and not r.lost


def test_not_supported_calls_and_fields_are_recorded_not_fatal(fake: FakeNvml) -> None:
    fake.fail_calls = {
        ("nvmlDeviceGetTemperatureV", 0): NOT_SUPPORTED,
        ("nvmlDeviceGetRemappedRows", 0): NOT_SUPPORTED,
        ("nvmlDeviceGetTotalEnergyConsumption", 0): pynvml.NVML_ERROR_NO_PERMISSION,
    }
    fake.fail_fields = {
        (pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_CRC, 0): NOT_SUPPORTED,
        (pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, 0): NOT_SUPPORTED,
    }
    provider = NvmlProvider(fake.module())
    try:
        r, other = provider.read_all()
    finally:
        provider.close()
    assert r.temp_c is None and r.remap_pending is None and r.energy_mj is None
    assert r.recovery_action is None
    assert r.nvlink_crc_errors == 2, "falls back to the per-lane totals"
    assert r.unsupported == {
        "temp_c": "Not Supported",
        "remapped_rows": "Not Supported",
        "energy_mj": "Insufficient Permissions",
        "nvlink_crc_dl": "Not Supported",
        "recovery_action": "Not Supported",
    }
    assert r.gpu_util == 80 and other.temp_c == 61 and other.unsupported == {}


def test_gpu_without_nvlink_leaves_nvlink_unsupported(fake: FakeNvml) -> None:
    fake.fail_fields = {(pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT, 0): NOT_SUPPORTED}
    provider = NvmlProvider(fake.module(), watch_events=False)
    r = provider.read_all()[0]
    provider.close()
    assert (r.nvlink_links, r.nvlink_links_down, r.nvlink_crc_errors) == (None, None, None)


@pytest.mark.parametrize(
    ("call", "field"),
    [("nvmlDeviceGetPowerUsage", None), (None, pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER)],
)
def test_lost_gpu_is_failed_and_the_others_keep_sampling(
    fake: FakeNvml, call: str | None, field: int | None
) -> None:
    if call:
        fake.fail_calls = {(call, 1): LOST}
    else:
        assert field is not None
        fake.fail_fields = {(field, 1): LOST}
    provider = NvmlProvider(fake.module())
    try:
        ok, lost = provider.read_all()
    finally:
        provider.close()
    assert lost.lost and lost.lost_reason == "GPU is lost" and lost.gpu_util is None
    assert not ok.lost and ok.gpu_util == 80
    verdict, _ = classify(lost, HealthMemory(), 1_700_000_000)
    assert verdict.state == GpuState.FAILED


@pytest.mark.parametrize("uuid_type", [str, bytes])
def test_xid_events_reach_the_reading(
    fake: FakeNvml, monkeypatch: pytest.MonkeyPatch, uuid_type: type
) -> None:
    if uuid_type is bytes:  # older pynvml: UUIDs come back as bytes
        as_str = fake.nvmlDeviceGetUUID
        monkeypatch.setattr(fake, "nvmlDeviceGetUUID", lambda h: as_str(h).encode())
    xid = pynvml.nvmlEventTypeXidCriticalError
    fake.events = [SimpleNamespace(device=1, eventType=xid, eventData=79)]
    provider = NvmlProvider(fake.module())
    try:
        deadline = time.monotonic() + 3
        xids: list[int] = []
        while not xids and time.monotonic() < deadline:
            xids = provider.read_all()[1].xids
            time.sleep(0.02)
    finally:
        provider.close()
    assert xids == [79]


def test_probe_reports_every_field(
    fake: FakeNvml, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake.fail_calls = {("nvmlDeviceGetTemperatureV", 1): NOT_SUPPORTED}
    assert probe(fake.module())[1]["unsupported"] == {"temp_c": "Not Supported"}
    monkeypatch.setitem(sys.modules, "pynvml", fake.module())
    assert cli.main(["--probe"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out) == 2 and out[0]["gpu_util"] == 80 and "unsupported" in out[1]
