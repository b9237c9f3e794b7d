"""Prometheus text metrics: per-GPU gauges (dcgm-exporter style) and the agent's own health.

Served by the stdlib ``http.server`` in a daemon thread at ``/metrics``.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from metering_agent.nvml.provider import GpuReading
from metering_agent.protocol import SEVERITY, GpuState

Labels = tuple[tuple[str, str], ...]

HELP = {
    "gpumeter_gpu_utilization_percent": "GPU utilisation (DCGM_FI_DEV_GPU_UTIL).",
    "gpumeter_gpu_memory_utilization_percent": "Memory controller utilisation.",
    "gpumeter_gpu_memory_used_mib": "Frame buffer used (DCGM_FI_DEV_FB_USED).",
    "gpumeter_gpu_memory_total_mib": "Frame buffer total.",
    "gpumeter_gpu_power_watts": "Power draw (DCGM_FI_DEV_POWER_USAGE).",
    "gpumeter_gpu_energy_joules_total": "Energy since driver load (DCGM_FI_DEV_TOTAL_ENERGY).",
    "gpumeter_gpu_temperature_celsius": "GPU temperature (DCGM_FI_DEV_GPU_TEMP).",
    "gpumeter_gpu_sm_clock_mhz": "SM clock (DCGM_FI_DEV_SM_CLOCK).",
    "gpumeter_gpu_clock_event_reasons": "Clock-event (throttle) reasons bitmask.",
    "gpumeter_gpu_ecc_corrected_volatile": "Volatile corrected ECC errors.",
    "gpumeter_gpu_ecc_uncorrected_volatile": "Volatile uncorrected ECC errors.",
    "gpumeter_gpu_nvlink_links_down": "NVLink links not active.",
    "gpumeter_gpu_nvlink_crc_errors_total": "NVLink CRC errors.",
    "gpumeter_gpu_pcie_replays_total": "PCIe replays (DCGM_FI_DEV_PCIE_REPLAY_COUNTER).",
    "gpumeter_gpu_processes": "Running compute processes.",
    "gpumeter_gpu_health_state": "0 healthy, 1 degraded, 2 failed.",
    "gpumeter_agent_spool_bytes": "Bytes in the spool (journal and batches).",
    "gpumeter_agent_spool_batches": "Sealed batches waiting for upload.",
    "gpumeter_agent_spool_journal_items": "Items in the journal, not yet sealed into a batch.",
    "gpumeter_agent_spool_held_items": "Items held in memory because the spool is full.",
    "gpumeter_agent_spool_held_bytes": "Bytes of the items held in memory (bounded).",
    "gpumeter_agent_spool_full": "1 while the spool takes no writes (size limit, disk full).",
    "gpumeter_agent_spool_dropped_items_total": "Items dropped beyond the memory bound.",
    "gpumeter_agent_spool_dropped_seconds_total": "GPU-seconds dropped beyond the memory bound.",
    "gpumeter_agent_spool_quarantined_total": "Unreadable spool files moved to quarantine/.",
    "gpumeter_agent_last_upload_success_timestamp_seconds": "Time of the last 2xx upload.",
    "gpumeter_agent_upload_errors_total": "Failed upload attempts (network, 5xx).",
    "gpumeter_agent_upload_throttled_total": "503/429 answers: the service shed load.",
    "gpumeter_agent_batches_dead_lettered_total": "Batches rejected with a 4xx.",
    "gpumeter_agent_batches_uploaded_total": "Batches accepted by the service.",
    "gpumeter_agent_items_held_total": "Items the service holds: their GPU's UUID is in dispute.",
    "gpumeter_agent_items_refused_total": "Items of stored batches the service refused (kept "
    "in dead-letter/).",
    "gpumeter_agent_upload_bytes_total": "Request body bytes sent (after gzip).",
    "gpumeter_agent_upload_uncompressed_bytes_total": "Request body bytes before gzip.",
    "gpumeter_agent_upload_connections_total": "HTTP connections opened to the service.",
    "gpumeter_agent_sample_lag_seconds": "How late the last sample was after its second began.",
    "gpumeter_agent_clock_jumps_total": "Wall-clock jumps against the monotonic clock.",
    "gpumeter_agent_unsampled_seconds_total": "Seconds no tick sampled (paused, stalled).",
}

# Reading attribute -> metric, with a scale factor.
GPU_GAUGES: tuple[tuple[str, str, float], ...] = (
    ("gpu_util", "gpumeter_gpu_utilization_percent", 1),
    ("mem_util", "gpumeter_gpu_memory_utilization_percent", 1),
    ("mem_used_mib", "gpumeter_gpu_memory_used_mib", 1),
    ("mem_total_mib", "gpumeter_gpu_memory_total_mib", 1),
    ("power_mw", "gpumeter_gpu_power_watts", 1e-3),
    ("energy_mj", "gpumeter_gpu_energy_joules_total", 1e-3),
    ("temp_c", "gpumeter_gpu_temperature_celsius", 1),
    ("sm_clock_mhz", "gpumeter_gpu_sm_clock_mhz", 1),
    ("clock_event_reasons", "gpumeter_gpu_clock_event_reasons", 1),
    ("ecc_corrected_volatile", "gpumeter_gpu_ecc_corrected_volatile", 1),
    ("ecc_uncorrected_volatile", "gpumeter_gpu_ecc_uncorrected_volatile", 1),
    ("nvlink_links_down", "gpumeter_gpu_nvlink_links_down", 1),
    ("nvlink_crc_errors", "gpumeter_gpu_nvlink_crc_errors_total", 1),
    ("pcie_replays", "gpumeter_gpu_pcie_replays_total", 1),
    ("process_count", "gpumeter_gpu_processes", 1),
)


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, dict[Labels, float]] = {}

    def set(self, name: str, value: float, **labels: str) -> None:
        with self._lock:
            self._values.setdefault(name, {})[tuple(sorted(labels.items()))] = value

    def inc(self, name: str, by: float = 1, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        with self._lock:
            series = self._values.setdefault(name, {})
            series[key] = series.get(key, 0) + by

    def get(self, name: str, **labels: str) -> float | None:
        with self._lock:
            return self._values.get(name, {}).get(tuple(sorted(labels.items())))

    def update_gpu(self, r: GpuReading, state: GpuState) -> None:
        labels = {"gpu": str(r.index), "uuid": r.uuid, "model": r.name}
        for attr, name, scale in GPU_GAUGES:
            value = getattr(r, attr)
            if value is not None:
                self.set(name, value * scale, **labels)
        self.set("gpumeter_gpu_health_state", SEVERITY[state], **labels)

    def render(self) -> str:
        with self._lock:
            snapshot = {name: dict(series) for name, series in self._values.items()}
        return "".join(_render_family(name, series) for name, series in sorted(snapshot.items()))


def _render_family(name: str, series: dict[Labels, float]) -> str:
    kind = "counter" if name.endswith("_total") else "gauge"
    lines = [f"# HELP {name} {HELP.get(name, name)}", f"# TYPE {name} {kind}"]
    lines.extend(f"{name}{_labels(labels)} {value:g}" for labels, value in sorted(series.items()))
    return "\n".join(lines) + "\n"


def _labels(labels: Labels) -> str:
    if not labels:
        return ""
    body = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
    return "{" + body + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def serve(metrics: Metrics, port: int, host: str = "0.0.0.0") -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404)
                return
            body = metrics.render().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # scrapes every few seconds would drown the structured log

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server
