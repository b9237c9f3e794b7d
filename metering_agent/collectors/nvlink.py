"""NVLink: links present, links gone from up to down, CRC, replay and recovery errors summed
over every link.

Every NVLink field is scoped by link id (``scopeId``); a bare field id reads link 0 only. Link
states and the replay / recovery counters (DCGM's NVLink health watch reads both) come from the
slow field-values call, CRC counters from the per-second one. A link whose replay or recovery
counter is unsupported (NVML marks the DL counters unsupported on Blackwell) leaves the sum None.
A link inactive when first seen (present, never cabled) is not "down": only a link seen up and
then inactive counts. GPUs that do not answer the per-link
DL CRC counter (older drivers; NVML's field docs mark the DL counters unsupported on Blackwell
and later) are read through the per-link flit + data CRC totals; a GPU answering neither
reports the CRC count unsupported.
"""

from __future__ import annotations

from metering_agent.collectors.base import FieldRequest, Sample, as_int, field_values

# Counter sets to try, in order; the first one a GPU answers is kept.
CRC_CHOICES: tuple[tuple[tuple[str, str], ...], ...] = (
    (("nvlink_crc_dl", "NVML_FI_DEV_NVLINK_ERROR_DL_CRC"),),
    (
        ("nvlink_crc_flit", "NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"),
        ("nvlink_crc_data", "NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL"),
    ),
)
NVLINK_STATE_INACTIVE = 0  # NVML_NVLINK_STATE_INACTIVE (not defined by nvidia-ml-py 12.560)
ERROR_COUNTERS = (
    ("nvlink_replay_errors", "NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL"),
    ("nvlink_recovery_errors", "NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL"),
)
SLOW_ATTRS = ("nvlink_links", "nvlink_links_down", *(attr for attr, _name in ERROR_COUNTERS))


def discover(s: Sample) -> None:
    """How many links the GPU has (static): read once, on the GPU's first slow sample."""
    if s.device.links is None:
        count = field_values(s, [("nvlink_links", s.nv.NVML_FI_DEV_NVLINK_LINK_COUNT, 0)])
        s.device.links = as_int(count["nvlink_links"]) or 0  # unsupported: a PCIe card


def slow_requests(s: Sample) -> list[FieldRequest]:
    """Per link: its state, replay and recovery error counts."""
    fields = [("nvlink_state", "NVML_FI_DEV_NVLINK_GET_STATE"), *ERROR_COUNTERS]
    return [
        (f"{key}:{link}", getattr(s.nv, name), link)
        for key, name in fields
        for link in range(s.device.links or 0)
    ]


def apply_slow(s: Sample, values: dict[str, int | float | None]) -> None:
    links = s.device.links
    if not links:
        return  # no NVLink on this GPU: every NVLink field stays None
    s.reading.nvlink_links = links
    for attr, _name in ERROR_COUNTERS:
        counts = [values[f"{attr}:{link}"] for link in range(links)]
        if all(count is not None for count in counts):
            setattr(s.reading, attr, sum(int(count or 0) for count in counts))
    states = {link: values[f"nvlink_state:{link}"] for link in range(links)}
    if all(state is None for state in states.values()):
        return
    s.device.links_ever_up |= {
        link for link, state in states.items() if state not in (None, NVLINK_STATE_INACTIVE)
    }
    down = {link for link, state in states.items() if state == NVLINK_STATE_INACTIVE}
    s.reading.nvlink_links_down = len(down & s.device.links_ever_up)


def crc_requests(s: Sample) -> list[FieldRequest]:
    links = s.device.links
    if not links or s.device.crc_choice >= len(CRC_CHOICES):
        return []
    return [
        (f"{key}:{link}", getattr(s.nv, constant), link)
        for key, constant in CRC_CHOICES[s.device.crc_choice]
        for link in range(links)
    ]


def apply_crc(s: Sample, values: dict[str, int | float | None]) -> None:
    requests = crc_requests(s)
    if not requests:
        if s.device.links and s.device.crc_choice >= len(CRC_CHOICES):
            s.reading.unsupported["nvlink_crc_errors"] = "no per-link CRC counter answered"
        return
    counts = [values[key] for key, _fid, _scope in requests]
    if any(count is not None for count in counts):
        s.reading.nvlink_crc_errors = sum(int(count) for count in counts if count is not None)
    elif not s.device.crc_seen:
        s.device.crc_choice += 1  # this GPU never answered these counters: try the next set
        return
    s.device.crc_seen = True
