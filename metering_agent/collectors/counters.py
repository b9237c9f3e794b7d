"""The per-second field-values call: every fast counter of a GPU in one NVML round trip.

Volatile ECC counts (since the last reset), the PCIe replay counter, the total-energy counter
(makes energy exact between samples), the driver's recovery action and NVLink CRC per link.
"""

from metering_agent.collectors import nvlink
from metering_agent.collectors.base import (
    FieldRequest,
    Sample,
    as_int,
    binding_constant,
    field_values,
)

COUNTER_FIELDS = (
    ("ecc_corrected_volatile", "NVML_FI_DEV_ECC_SBE_VOL_TOTAL"),
    ("ecc_uncorrected_volatile", "NVML_FI_DEV_ECC_DBE_VOL_TOTAL"),
    ("pcie_replays", "NVML_FI_DEV_PCIE_REPLAY_COUNTER"),
    ("energy_mj", "NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION"),
)


def collect(s: Sample) -> None:
    requests: list[FieldRequest] = [(attr, getattr(s.nv, name), 0) for attr, name in COUNTER_FIELDS]
    recovery = binding_constant(s, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", "recovery_action")
    if recovery is not None:
        requests.append(("recovery_action", recovery, 0))
    values = field_values(s, requests + nvlink.crc_requests(s))
    for attr, _fid, _scope in requests:
        setattr(s.reading, attr, as_int(values[attr]))
    nvlink.apply_crc(s, values)
