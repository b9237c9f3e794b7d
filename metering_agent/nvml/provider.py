"""The NVML provider protocol and the per-second reading every provider fills.

A field left at ``None`` means "not available": the call or field is not supported on this
device (the reason is in ``GpuReading.unsupported``) or the GPU is lost.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

# NVML recovery actions (field NVML_FI_DEV_GET_GPU_RECOVERY_ACTION): absent from nvidia-ml-py
# 12.560.30 (R560 headers), present in 13.615.71; 6 and 7 came with R615 (NVML change log).
RECOVERY_ACTIONS = {
    0: "none",
    1: "gpu_reset",
    2: "node_reboot",
    3: "drain_p2p",
    4: "drain_and_reset",
    5: "recover_imex_domain",
    6: "bus_reset",
    7: "system_reboot",
}

# Clock-event (throttle) reason bits, nvmlClocksEventReason*.
CLOCKS_EVENT_SW_POWER_CAP = 0x04
CLOCKS_EVENT_HW_SLOWDOWN = 0x08
CLOCKS_EVENT_SW_THERMAL = 0x20
CLOCKS_EVENT_HW_THERMAL = 0x40
CLOCKS_EVENT_HW_POWER_BRAKE = 0x80


@dataclass(frozen=True, slots=True)
class GpuInfo:
    index: int
    uuid: str  # NVML format: "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
    name: str  # NVML device name, e.g. "NVIDIA H100 80GB HBM3"
    minor: int | None = None  # /dev/nvidia<minor>; None where NVML cannot say


@dataclass(slots=True)
class GpuReading:
    index: int
    uuid: str
    name: str
    minor: int | None = None  # the device's minor number (GpuInfo.minor)
    lost: bool = False  # GPU fell off the bus / NVML says GpuIsLost: nothing else is readable
    lost_reason: str | None = None
    recovered: bool = False  # seen reset since the last reading (a lost GPU answering again)
    gpu_util: int | None = None  # percent
    mem_util: int | None = None  # percent
    mem_used_mib: int | None = None
    mem_total_mib: int | None = None
    power_mw: int | None = None
    energy_mj: int | None = None  # total energy counter since driver load
    temp_c: int | None = None
    sm_clock_mhz: int | None = None
    clock_event_reasons: int | None = None  # bitmask of nvmlClocksEventReason*
    ecc_corrected_volatile: int | None = None
    ecc_uncorrected_volatile: int | None = None
    retired_pages_pending: bool | None = None
    remap_pending: bool | None = None  # None also means "no row remapping" (before Ampere)
    remap_failure: bool | None = None
    remapped_rows_correctable: int | None = None  # rows remapped so far (permanent)
    remapped_rows_uncorrectable: int | None = None
    # Banks by spare rows left (nvmlDeviceGetRowRemapperHistogram): max, high, partial, low, none.
    remap_histogram: dict[str, int] | None = None
    retired_pages_sbe: int | None = None  # pages retired so far (before Ampere; permanent)
    retired_pages_dbe: int | None = None
    nvlink_links: int | None = None  # links present
    nvlink_links_down: int | None = None
    nvlink_crc_errors: int | None = None  # cumulative flit + data CRC errors, all links
    nvlink_replay_errors: int | None = None  # cumulative, all links (link-level retransmits)
    nvlink_recovery_errors: int | None = None  # cumulative, all links (link retrains)
    pcie_replays: int | None = None  # cumulative
    recovery_action: int | None = None  # key of RECOVERY_ACTIONS
    process_count: int | None = None  # running compute processes
    mig_enabled: bool | None = None  # MIG mode on: metered as one whole GPU all the same
    xids: list[int] = field(default_factory=list)  # XIDs seen since the previous reading
    dbe_events: int = 0  # double-bit ECC events seen since the previous reading
    event_errors: list[str] = field(default_factory=list)  # the XID event path failing
    unsupported: dict[str, str] = field(default_factory=dict)  # field -> NVML error text


class GpuProvider(Protocol):
    """What the 1 Hz loop needs from a source of GPU readings."""

    def gpus(self) -> list[GpuInfo]: ...

    def read_all(self) -> list[GpuReading]:
        """One reading per GPU, never raising for a single GPU's trouble."""
        ...

    def close(self) -> None: ...
