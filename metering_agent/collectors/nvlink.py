"""NVLink: how many links are down, and the cumulative CRC error count over all links."""

from types import ModuleType
from typing import Any

from metering_agent.collectors.base import as_int, field_values, query
from metering_agent.nvml.provider import GpuReading


def collect(nv: ModuleType, handle: Any, r: GpuReading) -> None:
    fields = field_values(
        nv,
        handle,
        r,
        {
            "nvlink_links": nv.NVML_FI_DEV_NVLINK_LINK_COUNT,
            "nvlink_crc_dl": nv.NVML_FI_DEV_NVLINK_ERROR_DL_CRC,
            "nvlink_crc_flit": nv.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
            "nvlink_crc_data": nv.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL,
        },
    )
    links = as_int(fields["nvlink_links"])
    if not links:
        return  # no NVLink on this GPU (PCIe cards): leave every NVLink field unsupported
    r.nvlink_links = links
    states = [
        query(nv, r, f"nvlink_state_{link}", nv.nvmlDeviceGetNvLinkState, handle, link)
        for link in range(links)
    ]
    r.nvlink_links_down = sum(1 for s in states if s == 0)  # None (unsupported) is not "down"
    # Hopper reports the per-link DL counter; older drivers the per-lane totals.
    if fields["nvlink_crc_dl"] is not None:
        r.nvlink_crc_errors = as_int(fields["nvlink_crc_dl"])
    elif fields["nvlink_crc_flit"] is not None or fields["nvlink_crc_data"] is not None:
        r.nvlink_crc_errors = int(fields["nvlink_crc_flit"] or 0) + int(
            fields["nvlink_crc_data"] or 0
        )
