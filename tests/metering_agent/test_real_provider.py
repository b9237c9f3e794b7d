"""The pynvml provider against a fake pynvml modelled on the installed binding.

CI runs this file against the oldest allowed nvidia-ml-py and the newest (``.ci/nvml-bindings``):
the fake takes its constants, structures and the set of functions from the binding under test.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import ModuleType

import pynvml
import pytest

from metering_agent import cli
from metering_agent.classifier import HealthMemory, classify
from metering_agent.nvml.fake import FakeGpu, FakeNvml
from metering_agent.nvml.real import UNKNOWN_LOST_AFTER, NvmlProvider, probe
from metering_agent.protocol import EventKind, GpuState
from metering_agent.records import RecordBuilder
from metering_agent.xid_catalog import CATALOG_SOURCE, CATALOG_VERSION

NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
XID = pynvml.nvmlEventTypeXidCriticalError
HAS_RECOVERY_FIELD = hasattr(pynvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION")
T0 = 1_700_000_000
Start = Callable[..., NvmlProvider]


class Clock:
    """The provider's monotonic clock, moved by the test (slow signals, re-enumeration)."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def uuid(i: int) -> str:
    return f"GPU-0000000{i}-0000-0000-0000-000000000000"


@pytest.fixture
def fake() -> FakeNvml:
    return FakeNvml(pynvml, [FakeGpu(uuid(0)), FakeGpu(uuid(1))])


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def start(fake: FakeNvml, clock: Clock) -> Iterator[Start]:
    """``start(module=None, **options)``: a provider on the fake, closed after the test."""
    providers: list[NvmlProvider] = []

    def make(module: ModuleType | None = None, **options: object) -> NvmlProvider:
        provider = NvmlProvider(module or fake.module(), clock=clock, **options)  # type: ignore[arg-type]
        providers.append(provider)
        return provider

    yield make
    for provider in providers:
        provider.close()


def test_reads_every_signal(fake: FakeNvml, start: Start) -> None:
    fake.gpus[0] = FakeGpu(
        uuid(0), link_states=[1, 1, 1, 1], crc_dl={2: 7}, replay={0: 2, 3: 5}, recovery={1: 1},
        mig_mode=None, remap_histogram=(600, 30, 8, 2, 0),
    )  # fmt: skip
    r = start().read_all()[0]
    assert (r.uuid, r.name) == (uuid(0), "NVIDIA H100 80GB HBM3")
    assert (r.gpu_util, r.mem_util, r.mem_used_mib, r.mem_total_mib) == (80, 40, 1024, 81559)
    assert (r.power_mw, r.energy_mj, r.temp_c, r.sm_clock_mhz) == (350_000, 123_456_789, 61, 1980)
    assert (r.ecc_corrected_volatile, r.ecc_uncorrected_volatile) == (5, 0)
    assert (r.remap_pending, r.remap_failure, r.retired_pages_pending) == (False, False, None)
    assert (r.remapped_rows_correctable, r.remapped_rows_uncorrectable) == (2, 0)
    assert (r.nvlink_links, r.nvlink_links_down, r.nvlink_crc_errors) == (4, 0, 7)
    assert (r.nvlink_replay_errors, r.nvlink_recovery_errors) == (7, 1)
    assert r.remap_histogram == {"max": 600, "high": 30, "partial": 8, "low": 2, "none": 0}
    assert (r.pcie_replays, r.process_count, r.mig_enabled) == (3, 1, None)
    expected = {
        "retired_pages_pending": "Not Supported",
        "retired_pages_sbe": "Not Supported",
        "retired_pages_dbe": "Not Supported",
        "mig_mode": "Not Supported",
    }
    if HAS_RECOVERY_FIELD:
        assert r.recovery_action == 0
    else:  # nvidia-ml-py 12.560: the field is unsupported, everything else is read
        expected["recovery_action"] = (
            "this nvidia-ml-py has no NVML_FI_DEV_GET_GPU_RECOVERY_ACTION; upgrade it"
        )
    assert r.unsupported == expected and not r.lost


def test_binding_without_newer_names_still_meters(fake: FakeNvml, start: Start) -> None:
    """12.560.30 lacks nvmlDeviceGetTemperatureV and NVML_FI_DEV_GET_GPU_RECOVERY_ACTION."""
    module = fake.module()
    for name in ("nvmlDeviceGetTemperatureV", "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION"):
        if hasattr(module, name):
            delattr(module, name)
    r = start(module).read_all()[0]
    assert r.temp_c == 61 and r.gpu_util == 80 and r.recovery_action is None
    assert "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION" in r.unsupported["recovery_action"]
    assert "temp_c" not in r.unsupported


def test_driver_without_newer_symbols_falls_back_once(
    fake: FakeNvml, start: Start, clock: Clock
) -> None:
    """Drivers before R535 lack ..._v3 (the binding raises NVMLLibraryMismatchError, not an
    NVMLError), older ones nvmlDeviceGetTemperatureV and nvmlDeviceGetMemoryInfo_v2."""
    fake.driver_lacks = {
        "nvmlDeviceGetTemperatureV",
        "nvmlDeviceGetComputeRunningProcesses_v3",
        "nvmlDeviceGetMemoryInfo_v2",
    }
    provider = start()
    r = provider.read_all()[0]
    assert (r.temp_c, r.process_count) == (61, 1)
    assert r.mem_used_mib == 1024 + 512, "v1 counts driver-reserved memory as used"
    assert not {"temp_c", "process_count", "memory", "processes"} & set(r.unsupported)
    calls = fake.calls.copy()
    clock.t += 60
    provider.read_all()
    assert fake.calls["nvmlDeviceGetTemperatureV"] == calls["nvmlDeviceGetTemperatureV"]
    assert (
        fake.calls["nvmlDeviceGetComputeRunningProcesses"]
        == (calls["nvmlDeviceGetComputeRunningProcesses"])
    ), "the fallback is remembered"


def test_memory_is_read_through_nvml_memory_v2(fake: FakeNvml, start: Start) -> None:
    r = start().read_all()[0]
    assert r.mem_used_mib == 1024, "v2 excludes driver-reserved memory"


def test_an_unexpected_exception_marks_only_its_signal(
    fake: FakeNvml, start: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(h: object) -> None:
        raise RuntimeError("binding bug")

    monkeypatch.setattr(fake, "nvmlDeviceGetUtilizationRates", broken)
    r = start().read_all()[0]
    assert r.unsupported["utilization"] == "RuntimeError: binding bug"
    assert r.gpu_util is None and r.temp_c == 61 and r.process_count == 1 and not r.lost


def test_not_supported_calls_and_fields_are_recorded_not_fatal(
    fake: FakeNvml, start: Start
) -> None:
    fake.gpus[0].fail_calls = {
        "nvmlDeviceGetPowerUsage": pynvml.NVML_ERROR_NO_PERMISSION,
        "nvmlDeviceGetClockInfo": NOT_SUPPORTED,
    }
    fake.gpus[0].unsupported_fields = {pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION}
    r, other = start().read_all()
    assert r.power_mw is None and r.sm_clock_mhz is None and r.energy_mj is None
    assert r.unsupported["power_mw"] == "Insufficient Permissions"
    assert r.unsupported["sm_clock_mhz"] == r.unsupported["energy_mj"] == "Not Supported"
    assert r.gpu_util == 80 and other.power_mw == 350_000


def test_nvlink_crc_is_summed_over_every_link(fake: FakeNvml, start: Start) -> None:
    """The DL CRC field is scoped by link: a bare field id reads link 0 only."""
    fake.gpus[0] = FakeGpu(uuid(0), link_states=[1] * 18, crc_dl={0: 1, 5: 2, 17: 4})
    provider = start()
    assert provider.read_all()[0].nvlink_crc_errors == 7
    assert "nvmlDeviceGetNvLinkState" not in fake.calls, "link states come with the fields"


def test_gpus_without_the_dl_crc_field_use_the_per_link_totals(
    fake: FakeNvml, start: Start, clock: Clock
) -> None:
    fake.gpus[0] = FakeGpu(uuid(0), link_states=[1] * 4, crc_flit={1: 2}, crc_data={3: 3})
    fake.gpus[0].unsupported_fields = {pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_CRC}
    provider = start()
    provider.read_all()
    clock.t += 1
    r = provider.read_all()[0]
    assert r.nvlink_crc_errors == 5 and "nvlink_crc_dl" not in r.unsupported


def test_a_gpu_answering_no_crc_counter_says_so(fake: FakeNvml, start: Start, clock: Clock) -> None:
    fake.gpus[0] = FakeGpu(uuid(0), link_states=[1] * 18)
    fake.gpus[0].unsupported_fields = {
        pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_CRC,
        pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
        pynvml.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL,
    }
    provider = start()
    for _ in range(3):
        r = provider.read_all()[0]
        clock.t += 1
    assert r.nvlink_crc_errors is None and r.nvlink_links == 18 and r.nvlink_links_down == 0
    assert r.unsupported["nvlink_crc_errors"] == "no per-link CRC counter answered"


def test_only_links_that_were_up_count_as_down(fake: FakeNvml, start: Start, clock: Clock) -> None:
    """A link present but never cabled is inactive from the start: not a fault."""
    fake.gpus[0] = FakeGpu(uuid(0), link_states=[1, 1, 0, 0])
    provider = start()
    r = provider.read_all()[0]
    assert (r.nvlink_links, r.nvlink_links_down) == (4, 0)
    assert classify(r, HealthMemory(), T0)[0].state == GpuState.HEALTHY
    fake.gpus[0].link_states[1] = 0
    clock.t += 30  # past the slow interval
    r = provider.read_all()[0]
    assert r.nvlink_links_down == 1
    assert classify(r, HealthMemory(), T0)[0].state == GpuState.FAILED  # DCGM: link down fails


@pytest.mark.parametrize("failure", ["call", "field"])
def test_lost_gpu_is_failed_and_the_others_keep_sampling(
    fake: FakeNvml, start: Start, failure: str
) -> None:
    if failure == "call":
        fake.gpus[1].fail_calls = {"nvmlDeviceGetPowerUsage": pynvml.NVML_ERROR_GPU_IS_LOST}
    else:
        fake.gpus[1].fail_fields = {
            pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER: pynvml.NVML_ERROR_GPU_IS_LOST
        }
    ok, lost = start().read_all()
    assert lost.lost and lost.lost_reason == "GPU is lost" and lost.gpu_util is None
    assert not ok.lost and ok.gpu_util == 80
    assert classify(lost, HealthMemory(), T0)[0].state == GpuState.FAILED


def wait_for_xids(provider: NvmlProvider, index: int) -> list[int]:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        xids = provider.read_all()[index].xids
        if xids:
            return xids
    return []


@pytest.mark.parametrize("uuid_type", [str, bytes])
def test_xid_events_reach_the_reading(
    fake: FakeNvml, start: Start, monkeypatch: pytest.MonkeyPatch, uuid_type: type
) -> None:
    if uuid_type is bytes:  # older pynvml: UUIDs come back as bytes
        monkeypatch.setattr(fake, "nvmlDeviceGetUUID", lambda h: fake.gpu(h).uuid.encode())
    provider = start()
    fake.post_event(1, XID, 13)
    assert wait_for_xids(provider, 1) == [13]


def test_xid_79_from_a_gpu_that_no_longer_answers_is_kept(fake: FakeNvml, start: Start) -> None:
    provider = start()
    fake.gpus[1].lost = True  # its UUID lookup fails too: events map by handle, not by asking
    fake.post_event(1, XID, 79)
    assert wait_for_xids(provider, 1) == [79]


def test_event_wait_errors_are_reported_as_events(fake: FakeNvml, start: Start) -> None:
    fake.wait_errors = [pynvml.NVML_ERROR_UNKNOWN]
    provider = start()
    deadline, errors = time.monotonic() + 5, list[str]()
    while not errors and time.monotonic() < deadline:
        errors = provider.read_all()[0].event_errors
    assert errors == ["nvmlEventSetWait_v2 failed: Unknown Error"]
    r = provider.read_all()[0]
    r.event_errors = errors
    verdict, _ = classify(r, HealthMemory(), T0)
    assert [(e.kind, e.detail) for e in verdict.events] == [
        (EventKind.NVML_ERROR, {"error": "nvmlEventSetWait_v2 failed: Unknown Error"})
    ]
    assert verdict.state == GpuState.HEALTHY, "an event, not a GPU fault"


def test_no_event_set_the_agent_samples_without_xids_and_says_so(
    fake: FakeNvml, start: Start
) -> None:
    fake.event_set_error = pynvml.NVML_ERROR_NOT_SUPPORTED
    r = start().read_all()[0]
    assert r.gpu_util == 80
    assert r.unsupported["xid_events"] == "XID events unavailable: Not Supported"


def test_gpu_unreadable_at_start_and_new_gpus_are_picked_up(
    fake: FakeNvml, start: Start, clock: Clock
) -> None:
    fake.gpus[1].readable = False
    provider = start()
    assert [r.uuid for r in provider.read_all()] == [uuid(0)]
    fake.gpus[1].readable = True
    fake.gpus.append(FakeGpu(uuid(2)))
    clock.t += 31  # the next enumeration
    assert [r.uuid for r in provider.read_all()] == [uuid(0), uuid(1), uuid(2)]


def test_a_gpu_back_after_a_reset_clears_the_latched_xid(
    fake: FakeNvml, start: Start, clock: Clock
) -> None:
    provider = start()
    fake.gpus[1].lost = True
    fake.post_event(1, XID, 79)
    memory = HealthMemory()
    deadline = time.monotonic() + 5
    while "xid_79_gpu_has_fallen_off_the_bus" not in memory.held and time.monotonic() < deadline:
        verdict, memory = classify(provider.read_all()[1], memory, T0)
    assert memory.state == GpuState.FAILED and "xid_79_gpu_has_fallen_off_the_bus" in memory.held
    fake.gpus[1].lost = False  # reset: it answers again (its handle renewed at enumeration)
    clock.t += 31
    r = provider.read_all()[1]
    assert r.recovered and not r.lost
    verdict, memory = classify(r, memory, T0 + 5)
    assert verdict.state == GpuState.HEALTHY


def test_pre_ampere_gpus_report_retired_page_totals(fake: FakeNvml, start: Start) -> None:
    fake.gpus[0] = FakeGpu(uuid(0), name="Tesla V100-SXM2-32GB", remap=None, retired_pending=0,
                           retired=(40, 23))  # fmt: skip
    r = start().read_all()[0]
    assert (r.retired_pages_sbe, r.retired_pages_dbe, r.retired_pages_pending) == (40, 23, False)
    assert r.remap_pending is None and r.remap_histogram is None
    verdict, _ = classify(r, HealthMemory(), T0)
    assert verdict.state == GpuState.FAILED  # DCGM's limit: 63 retired pages
    assert {ev.rule for ev in verdict.evidence} == {"retired_pages_limit"}


def _latch_xid(provider: NvmlProvider, gpu: int, code: int) -> HealthMemory:
    """Classify until the XID posted for ``gpu`` reaches its reading; returns the memory."""
    memory = HealthMemory()
    deadline = time.monotonic() + 5
    while not memory.latched() and time.monotonic() < deadline:
        _, memory = classify(provider.read_all()[gpu], memory, T0)
    assert memory.state == GpuState.FAILED and memory.latched(), code
    return memory


REPAIRS = {
    # what a reset or driver reload changes on the GPU, and the signal the classifier names
    "volatile ECC zeroed": (lambda g: setattr(g, "ecc_dbe", 0), "ecc_uncorrected_volatile"),
    "energy counter restarted": (lambda g: setattr(g, "energy_mj", 1_000), "energy_mj"),
    "pending remap applied": (lambda g: setattr(g, "remap", (2, 1, 0, 0)), "remap_pending"),
}


@pytest.mark.parametrize("repair", sorted(REPAIRS))
def test_a_reset_seen_through_nvml_repairs_a_latched_failure(
    fake: FakeNvml, start: Start, clock: Clock, repair: str
) -> None:
    change, signal = REPAIRS[repair]
    fake.gpus[1].ecc_dbe, fake.gpus[1].remap = 2, (2, 1, 1, 0)  # a DBE, its row pending remap
    provider = start()
    fake.post_event(1, XID, 48)
    memory = _latch_xid(provider, 1, 48)
    for second in range(1, 40):  # the slow reads come round too: nothing else repairs it
        clock.t += 1
        verdict, memory = classify(provider.read_all()[1], memory, T0 + second)
        assert verdict.state == GpuState.FAILED
    change(fake.gpus[1])
    clock.t += 16  # past the next slow read
    verdict, memory = classify(provider.read_all()[1], memory, T0 + 60)
    assert verdict.state != GpuState.FAILED
    [state_change] = [e for e in verdict.events if e.kind == EventKind.STATE_CHANGE]
    assert state_change.detail["repaired"] == f"{signal}_went_down"


def test_a_pre_ampere_reset_applies_the_pending_page_retirement(
    fake: FakeNvml, start: Start, clock: Clock
) -> None:
    fake.gpus[0] = FakeGpu(uuid(0), name="Tesla V100-SXM2-32GB", remap=None, retired_pending=1,
                           retired=(3, 1), ecc_dbe=0)  # fmt: skip
    provider = start()
    fake.post_event(0, XID, 48)
    memory = _latch_xid(provider, 0, 48)
    fake.gpus[0].retired_pending, fake.gpus[0].retired = 0, (3, 2)
    clock.t += 16
    verdict, _ = classify(provider.read_all()[0], memory, T0 + 20)
    assert verdict.state == GpuState.HEALTHY


def test_unknown_error_on_every_call_is_lost_after_a_bound(fake: FakeNvml, start: Start) -> None:
    provider = start()
    fake.gpus[1].unknown = True
    readings = [provider.read_all()[1] for _ in range(UNKNOWN_LOST_AFTER)]
    assert [r.lost for r in readings] == [False] * (UNKNOWN_LOST_AFTER - 1) + [True]
    assert readings[-1].lost_reason == (
        f"every NVML call failed with Unknown Error for {UNKNOWN_LOST_AFTER} samples"
    )


def test_a_hung_gpu_is_reported_and_the_others_go_on(
    fake: FakeNvml, start: Start, clock: Clock
) -> None:
    provider = start(sample_timeout_s=0.2)
    hang = fake.gpus[1].hang = threading.Event()
    try:
        for _ in range(2):  # the second tick neither queues behind the hung call nor waits
            clock.t += 31  # on the re-enumeration, which hangs on that GPU too
            began = time.monotonic()
            ok, hung = provider.read_all()
            assert time.monotonic() - began < 1.0
            assert ok.gpu_util == 80 and not ok.lost
            assert hung.lost and "NVML has not answered for" in (hung.lost_reason or "")
    finally:
        hang.set()
    fake.gpus[1].hang = None
    deadline, r = time.monotonic() + 5, hung
    while r.lost and time.monotonic() < deadline:
        r = provider.read_all()[1]
    assert not r.lost and r.gpu_util == 80


def test_mig_mode_is_detected_and_metered_per_whole_gpu(fake: FakeNvml, start: Start) -> None:
    fake.gpus[0].mig_mode = pynvml.NVML_DEVICE_MIG_ENABLE
    assert start().read_all()[0].mig_enabled is True
    gpus = probe(fake.module())["gpus"]
    assert gpus[0]["metering"].startswith("whole GPU (MIG mode is on")
    assert gpus[1]["metering"] == "whole GPU"


def test_calls_per_gpu_second_at_steady_state(fake: FakeNvml, start: Start, clock: Clock) -> None:
    fake.gpus[:] = [FakeGpu(uuid(i), link_states=[1] * 18) for i in range(8)]
    provider = start(watch_events=False)
    provider.read_all()
    calls, seconds = provider.nvml_calls(), 120
    for _ in range(seconds):
        clock.t += 1
        provider.read_all()
    per_gpu_second = (provider.nvml_calls() - calls) / (8 * seconds)
    assert per_gpu_second <= 8, per_gpu_second  # 7 per second, the slow ones every 15 s


def test_probe_reports_versions_every_call_and_its_time(
    fake: FakeNvml, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake.gpus[1].fail_calls = {"nvmlDeviceGetPowerUsage": NOT_SUPPORTED}
    monkeypatch.setitem(sys.modules, "pynvml", fake.module())
    assert cli.main(["--probe"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["xid_catalog"] == {"version": CATALOG_VERSION, "source": CATALOG_SOURCE}
    assert out["driver_version"] == "550.54.15" and out["nvml_version"] == "12.550.54.15"
    gpu = out["gpus"][1]
    assert (gpu["uuid"], gpu["driver_version"], gpu["metering"]) == (
        uuid(1),
        "550.54.15",
        "whole GPU",
    )
    power = next(c for c in gpu["calls"] if c["call"] == "nvmlDeviceGetPowerUsage")
    assert power["error"] == "Not Supported" and power["ms"] >= 0
    util = next(c for c in gpu["calls"] if c["call"] == "nvmlDeviceGetUtilizationRates")
    assert util["result"] == {"gpu": 80, "memory": 40}
    assert gpu["reading"]["unsupported"]["power_mw"] == "Not Supported"


def test_probe_without_the_nvml_library_says_how_to_install_it() -> None:
    """This machine has pynvml but no libnvidia-ml.so.1: what a node without a driver sees."""
    result = subprocess.run(
        [sys.executable, "-m", "metering_agent", "--probe"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert "NVML not found" in lines[0] and "NVIDIA driver" in lines[0]


def test_probe_without_the_binding_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    assert cli.main(["--probe"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nvidia-ml-py" in err[0]


def test_each_gpu_is_read_with_its_device_minor_number(fake: FakeNvml, start: Start) -> None:
    """A node whose device files number GPUs in another order than NVML: GPU 0 is
    /dev/nvidia1 (what Slurm's gres.conf names); a driver that cannot say leaves it None,
    and the GPU is metered all the same."""
    fake.gpus[0] = FakeGpu(uuid(0), minor=1)
    fake.gpus[1] = FakeGpu(uuid(1), minor=0)
    readings = start().read_all()
    assert [(r.index, r.uuid, r.minor) for r in readings] == [(0, uuid(0), 1), (1, uuid(1), 0)]
    record = RecordBuilder(readings[0].uuid, readings[0].name, 0, 0, readings[0].minor)
    record.add(T0, readings[0], GpuState.HEALTHY)
    [closed] = record.close()
    assert (closed.device_index, closed.minor_number) == (0, 1)
    fake.gpus[1].fail_calls["nvmlDeviceGetMinorNumber"] = NOT_SUPPORTED
    again = FakeNvml(pynvml, fake.gpus)
    assert [r.minor for r in start(again.module()).read_all()] == [1, None]
