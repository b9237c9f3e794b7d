"""Agent cost benchmark: CPU time per GPU-second sampled and RSS, 8 and 64 simulated GPUs, upload
bytes per GPU-second (gzip'd as sent and before gzip), and NVML calls per GPU-second of the real
provider. The 8-GPU run is repeated with ``--no-gzip`` to show what compression costs in CPU.
With ``--real`` it runs the agent on the node's real GPUs (NVML) instead, once, and writes the last
batch the sink received to ``--save-batch`` (inflated JSON) so its readings can be inspected.

Runs the real agent process (``python -m metering_agent --simulate N``) against a local sink
that accepts every batch, and reads the agent's /proc/<pid>/stat and /proc/<pid>/status.
CPU is measured over the steady state (after a warm-up that covers imports and start-up).
NVML calls are counted on the real provider driving the fake pynvml (8 H100s, without NVLink and
with 18 links each) over ``NVML_SECONDS`` simulated seconds after the first sample: every call
the sampler and the re-enumeration make (the event thread's blocking wait, two a second for the
whole node, is not a per-GPU cost). Prints one line per run, then one final JSON line. Linux only.

    .venv/bin/python bench/agent.py [--seconds 30] [--warmup 5] [--gpus 8 64]
    python bench/agent.py --real --seconds 20 --save-batch last-batch.json   # on a GPU node
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pynvml

from metering_agent.nvml.fake import FakeGpu, FakeNvml
from metering_agent.nvml.real import NvmlProvider

REPO = Path(__file__).resolve().parents[1]
TICKS = os.sysconf("SC_CLK_TCK")
NVML_SECONDS = 300  # simulated: covers 20 slow-signal rounds and 10 re-enumerations
NVML_CALLS_TARGET = 12  # per GPU-second, steady state


class Sink(BaseHTTPRequestHandler):
    """Accepts every ingest batch, like a healthy service (kept-alive connections), counting the
    bytes received and the bytes they inflate to."""

    protocol_version = "HTTP/1.1"
    received: ClassVar[list[int]] = [
        0,
        0,
        0,
    ]  # body bytes as sent, inflated, requests (all runs; read as deltas)
    last_batch: ClassVar[bytes] = b""  # inflated

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        raw = gzip.decompress(body) if self.headers.get("Content-Encoding") == "gzip" else body
        Sink.received[0] += len(body)
        Sink.received[1] += len(raw)
        Sink.received[2] += 1
        Sink.last_batch = raw
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "12")
        self.end_headers()
        self.wfile.write(b'{"ok": true}')

    def log_message(self, format: str, *args: object) -> None:
        pass


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def rss_mib(pid: int) -> tuple[float, float]:
    status = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return int(status["VmRSS"].split()[0]) / 1024, int(status["VmHWM"].split()[0]) / 1024


def run(gpus: int, seconds: float, warmup: float, server_url: str, *options: str) -> dict[str, Any]:
    """One agent run; ``gpus`` 0 is the node's real GPUs (NVML), counted from the last batch."""
    gpu_source = ["--simulate", str(gpus), "--seed", "1"] if gpus else []
    with tempfile.TemporaryDirectory() as spool:
        cmd = [
            sys.executable, "-m", "metering_agent", "--server", server_url, "--token", "bench",
            "--spool-dir", spool, *gpu_source,
            "--duration", str(warmup + seconds + 1), "--log-level", "warning", *options,
        ]  # fmt: skip
        agent = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
        time.sleep(warmup)
        if agent.poll() is not None:
            sys.exit(f"the agent exited ({agent.returncode}) during the warm-up: see its log above")
        cpu0, t0, received0 = cpu_seconds(agent.pid), time.monotonic(), list(Sink.received)
        time.sleep(seconds)
        cpu1, t1, received1 = cpu_seconds(agent.pid), time.monotonic(), list(Sink.received)
        rss, peak = rss_mib(agent.pid)
        agent.wait(timeout=60)
    cpu = cpu1 - cpu0
    wall = t1 - t0
    gpus = gpus or len(
        {r["gpu_uuid"] for r in json.loads(Sink.last_batch or b"{}").get("records", [])}
    )
    sent, inflated, requests = (b - a for a, b in zip(received0, received1, strict=True))
    return {
        "gpus": gpus,
        "options": " ".join(options),
        "requests_per_s": round(requests / wall, 2),
        "upload_bytes_per_gpu_second": round(sent / (gpus * wall), 1),
        "upload_bytes_per_gpu_second_before_gzip": round(inflated / (gpus * wall), 1),
        "seconds": round(wall, 1),
        "cpu_s": round(cpu, 3),
        "cpu_percent_of_core": round(100 * cpu / wall, 3),
        "cpu_ms_per_gpu_second": round(1000 * cpu / (gpus * wall), 4),
        "rss_mib": round(rss, 1),
        "peak_rss_mib": round(peak, 1),
        "exit_code": agent.returncode,
    }


def nvml_calls_per_gpu_second(gpus: int, links: int) -> float:
    """The real provider on the fake pynvml, its clock stepped one second per sample."""
    clock = [0.0]
    fake = FakeNvml(pynvml, [FakeGpu(f"GPU-{i}", link_states=[1] * links) for i in range(gpus)])
    provider = NvmlProvider(fake.module(), clock=lambda: clock[0])
    try:
        provider.read_all()  # the first sample reads the slow signals and link count too
        calls = provider.nvml_calls()
        for _ in range(NVML_SECONDS):
            clock[0] += 1
            provider.read_all()
        return round((provider.nvml_calls() - calls) / (gpus * NVML_SECONDS), 2)
    finally:
        provider.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=30)
    p.add_argument("--warmup", type=float, default=5)
    p.add_argument("--gpus", type=int, nargs="+", default=[8, 64])
    p.add_argument("--real", action="store_true", help="the node's real GPUs (NVML), one run")
    p.add_argument("--save-batch", type=Path, help="write the last batch received (JSON) here")
    args = p.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    runs = [(gpus, ()) for gpus in args.gpus] + [(8, ("--no-gzip",))] * (8 in args.gpus)
    if args.real:
        runs = [(0, ())]
    results = []
    for gpus, options in runs:
        result = run(gpus, args.seconds, args.warmup, url, *options)
        results.append(result)
        print(
            f"{result['gpus']:3d} GPUs {' '.join(options) or 'gzip'}: "
            f"{result['cpu_percent_of_core']:.3f} % of a core, "
            f"{result['cpu_ms_per_gpu_second']:.4f} ms CPU per GPU-second, "
            f"RSS {result['rss_mib']:.1f} MiB (peak {result['peak_rss_mib']:.1f}), "
            f"{result['upload_bytes_per_gpu_second']} upload B per GPU-second "
            f"({result['upload_bytes_per_gpu_second_before_gzip']} before gzip), "
            f"{result['requests_per_s']} requests/s",
            flush=True,
        )
    server.shutdown()
    if args.save_batch:
        args.save_batch.write_bytes(Sink.last_batch)
    eight = next((r for r in results if r["gpus"] == 8 and not r["options"]), None)
    target = None
    if eight is not None:
        target = eight["cpu_percent_of_core"] < 1 and eight["peak_rss_mib"] < 80
    nvml = {
        "no_nvlink": nvml_calls_per_gpu_second(8, 0),
        "nvlink_18_links": nvml_calls_per_gpu_second(8, 18),
    }
    print(
        f"NVML calls per GPU-second (8 GPUs, real provider on the fake pynvml): "
        f"{nvml['no_nvlink']} without NVLink, {nvml['nvlink_18_links']} with 18 links",
        flush=True,
    )
    summary = {
        "bench": "agent",
        "results": results,
        "target_8_gpus_met": target,
        "nvml_calls_per_gpu_second": nvml,
        "nvml_calls_target_met": max(nvml.values()) <= NVML_CALLS_TARGET,
    }
    print(json.dumps(summary))
    return 0 if target is not False and summary["nvml_calls_target_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
