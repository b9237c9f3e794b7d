"""The slow field-values call (every ``SLOW_INTERVAL_S``): row remapping (Ampere and later),
page retirement (before Ampere) and NVLink link states, in one NVML round trip."""

from metering_agent.collectors import nvlink
from metering_agent.collectors.base import FieldRequest, Sample, as_int, field_values

REMAP_FIELDS = (
    ("remapped_rows_correctable", "NVML_FI_DEV_REMAPPED_COR"),
    ("remapped_rows_uncorrectable", "NVML_FI_DEV_REMAPPED_UNC"),
    ("remap_pending", "NVML_FI_DEV_REMAPPED_PENDING"),
    ("remap_failure", "NVML_FI_DEV_REMAPPED_FAILURE"),
    ("retired_pages_pending", "NVML_FI_DEV_RETIRED_PENDING"),
)
FLAGS = {"remap_pending", "remap_failure", "retired_pages_pending"}


def collect(s: Sample) -> None:
    nvlink.discover(s)
    requests: list[FieldRequest] = [(attr, getattr(s.nv, name), 0) for attr, name in REMAP_FIELDS]
    values = field_values(s, requests + nvlink.state_requests(s))
    for attr, _fid, _scope in requests:
        value = as_int(values[attr])
        setattr(s.reading, attr, bool(value) if attr in FLAGS and value is not None else value)
    nvlink.apply_states(s, values)
