"""The slow health reads (every ``SLOW_INTERVAL_S``): row remapping (Ampere and later), page
retirement (before Ampere), NVLink link states and replay / recovery counters in one NVML
field-values round trip, and the row-remapper histogram (banks by spare rows left, Ampere and
later) in one more call."""

from metering_agent.collectors import nvlink
from metering_agent.collectors.base import FieldRequest, Sample, as_int, field_values, query

REMAP_FIELDS = (
    ("remapped_rows_correctable", "NVML_FI_DEV_REMAPPED_COR"),
    ("remapped_rows_uncorrectable", "NVML_FI_DEV_REMAPPED_UNC"),
    ("remap_pending", "NVML_FI_DEV_REMAPPED_PENDING"),
    ("remap_failure", "NVML_FI_DEV_REMAPPED_FAILURE"),
    ("retired_pages_pending", "NVML_FI_DEV_RETIRED_PENDING"),
    ("retired_pages_sbe", "NVML_FI_DEV_RETIRED_SBE"),
    ("retired_pages_dbe", "NVML_FI_DEV_RETIRED_DBE"),
)
FLAGS = {"remap_pending", "remap_failure", "retired_pages_pending"}
HISTOGRAM = ("max", "high", "partial", "low", "none")
# What the slow reads fill, carried into every reading until they run again.
ATTRS: tuple[str, ...] = (
    *(attr for attr, _name in REMAP_FIELDS),
    "remap_histogram",
    *nvlink.SLOW_ATTRS,
)


def collect(s: Sample) -> None:
    nvlink.discover(s)
    requests: list[FieldRequest] = [(attr, getattr(s.nv, name), 0) for attr, name in REMAP_FIELDS]
    values = field_values(s, requests + nvlink.slow_requests(s))
    for attr, _fid, _scope in requests:
        value = as_int(values[attr])
        setattr(s.reading, attr, bool(value) if attr in FLAGS and value is not None else value)
    nvlink.apply_slow(s, values)
    if s.reading.remap_pending is not None:  # no row remapping, no histogram
        s.reading.remap_histogram = _histogram(s)


def _histogram(s: Sample) -> dict[str, int] | None:
    fn = getattr(s.nv, "nvmlDeviceGetRowRemapperHistogram", None)
    if fn is None:
        s.reading.unsupported["remap_histogram"] = "this nvidia-ml-py has no histogram call"
        return None
    values = query(s, "remap_histogram", fn, s.handle)
    return None if values is None else {key: int(getattr(values, key)) for key in HISTOGRAM}
