"""``gpumeter-agent``: meter this node's GPUs and ship the records to the gpumeter service."""

from __future__ import annotations

import argparse
import json
import signal
import socket
import sys
import threading
import time
from pathlib import Path

from metering_agent import healthcheck, logs
from metering_agent.faults import load_faults
from metering_agent.latch import LatchStore
from metering_agent.metrics import Metrics, serve
from metering_agent.nvml.provider import GpuProvider
from metering_agent.nvml.real import INSTALL_HINT, NvmlProvider, NvmlUnavailable, probe
from metering_agent.nvml.simulated import DEFAULT_MODEL, MODELS, SimulatedProvider
from metering_agent.runner import Runner, SystemClock
from metering_agent.schedule import UploadSchedule
from metering_agent.spool import DEFAULT_MAX_BYTES, DEFAULT_MAX_HELD_BYTES, Spool
from metering_agent.uploader import Backoff, Uploader
from metering_agent.xid_catalog import CATALOG_SOURCE, CATALOG_VERSION

log = logs.Log("metering_agent.cli")


def _numbers(listed: str) -> list[int]:
    """Comma-separated whole numbers (argparse says which argument is wrong)."""
    return [int(part) for part in listed.split(",")]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpumeter-agent",
        description="Sample GPUs at 1 Hz, spool usage records durably, upload them to gpumeter.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--server", help="service base URL, e.g. https://meter.example.com")
    token = p.add_mutually_exclusive_group()
    token.add_argument("--token", help="node token (prefer --token-file)")
    token.add_argument("--token-file", type=Path, help="file holding the node token")
    p.add_argument("--spool-dir", type=Path, help="durable spool directory")
    p.add_argument("--duration", type=float, help="stop cleanly after this many seconds")
    p.add_argument("--metrics-port", type=int, help="serve Prometheus /metrics on this port")
    p.add_argument("--metrics-host", default="0.0.0.0", help="address for /metrics")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.add_argument(
        "--probe",
        action="store_true",
        help="print the XID catalog version the agent classifies with and, per GPU, the driver"
        " and NVML versions and every NVML call's result (or error) and duration as JSON, then"
        " exit; exit code 2 when NVML is not found",
    )

    p.add_argument(
        "--health-check",
        action="store_true",
        help="Slurm's HealthCheckProgram: exit 1 when a GPU is failed (latched in --spool-dir's"
        " latch, or in one reading now), 0 when every GPU is fit; prints what it found as JSON",
    )
    p.add_argument(
        "--drain",
        action="store_true",
        help="with --health-check: drain this Slurm node ($SLURMD_NODENAME, else --node-name)"
        " when unfit, and resume it when fit again if this check drained it",
    )
    p.add_argument(
        "--dcgm-diag",
        action="store_true",
        help="with --health-check: also run DCGM's quick diagnostic (dcgmi diag -r 1) where"
        " dcgmi is installed; a test it fails makes the node unfit",
    )
    p.add_argument(
        "--clear-latch",
        action="append",
        metavar="GPU_UUID",
        help="with the agent stopped: mark this GPU (repeatable, or 'all') repaired in the"
        " --spool-dir's latch, for a repair the agent cannot see; prints what was cleared and"
        " exits (1 when a GPU was not latched)",
    )

    sim = p.add_argument_group("simulator (instead of NVML)")
    sim.add_argument("--simulate", type=int, metavar="N", help="simulate N GPUs")
    sim.add_argument("--faults", type=Path, help="fault script (JSON; YAML with PyYAML)")
    sim.add_argument(
        "--gpu-models",
        default=DEFAULT_MODEL,
        help=f"comma-separated models, assigned round-robin; known: {', '.join(MODELS)}",
    )
    sim.add_argument("--seed", type=int, help="random seed for the simulated readings")
    sim.add_argument("--node-name", default=socket.gethostname(), help="node name for UUIDs")
    sim.add_argument("--uuid-prefix", default="", help="makes UUIDs distinct per agent")
    sim.add_argument(
        "--simulate-minors",
        type=_numbers,
        metavar="M0,M1,...",
        help="each simulated GPU's device minor number (/dev/nvidia<minor>), in NVML index "
        "order (default: the index)",
    )

    up = p.add_argument_group("spool and upload")
    up.add_argument("--batch-max-records", type=int, default=500, help="items per batch")
    up.add_argument(
        "--upload-interval",
        type=float,
        default=10.0,
        help="seconds between upload rounds: dashboards lag by at most this; health events"
        " (failures, state changes) are sent at once, and records are spooled every second, so"
        " a SIGKILL loses at most a second. 10 s: a batch's cost to the service is mostly per"
        " batch, so five times the 2-s rounds' GPUs per core (bench/README.md)",
    )
    up.add_argument(
        "--upload-jitter-seed",
        type=int,
        help="seed of this agent's upload offset within the interval (default: random)",
    )
    up.add_argument(
        "--no-gzip", action="store_true", help="send request bodies uncompressed (old services)"
    )
    up.add_argument("--upload-timeout", type=float, default=10.0, help="HTTP timeout, seconds")
    up.add_argument("--backoff-max", type=float, default=60.0, help="max retry delay, seconds")
    up.add_argument("--spool-max-bytes", type=int, default=DEFAULT_MAX_BYTES)
    up.add_argument(
        "--spool-max-memory-bytes",
        type=int,
        default=DEFAULT_MAX_HELD_BYTES,
        help="items held in memory while the spool is full; beyond, reported as unmetered",
    )
    up.add_argument(
        "--shutdown-upload-timeout",
        type=float,
        default=10.0,
        help="at exit, seconds to keep uploading what is spooled",
    )
    return p


def _token(args: argparse.Namespace) -> str:
    token_file: Path | None = args.token_file
    if token_file is not None:
        return token_file.read_text().strip()
    token: str | None = args.token
    return token or ""


def _provider(args: argparse.Namespace) -> GpuProvider:
    if args.simulate is None:
        return NvmlProvider()  # loads pynvml and the driver's library only now
    return SimulatedProvider(
        args.simulate,
        models=[m.strip() for m in args.gpu_models.split(",")],
        node=args.node_name,
        uuid_prefix=args.uuid_prefix,
        seed=args.seed,
        faults=load_faults(args.faults) if args.faults else None,
        clock=time.monotonic,
        minors=args.simulate_minors,
    )


def _probe() -> int:
    catalog = {"xid_catalog": {"version": CATALOG_VERSION, "source": CATALOG_SOURCE}}
    print(json.dumps({**catalog, **probe()}, indent=2))
    return 0


def _clear_latch(spool_dir: Path, uuids: list[str]) -> int:
    cleared = LatchStore(spool_dir).clear(uuids)
    missing = [] if "all" in uuids else [uuid for uuid in uuids if uuid not in cleared]
    print(json.dumps({"cleared": cleared, "not_latched": missing}))
    return 1 if missing else 0


def _health_check(args: argparse.Namespace) -> int:
    provider = _provider(args)
    try:
        node = healthcheck.node_name(args.node_name)
        return healthcheck.run(
            args.spool_dir, provider, drain=args.drain, node=node, dcgm=args.dcgm_diag
        )
    finally:
        provider.close()


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logs.setup(args.log_level)
    try:
        if args.probe:
            return _probe()
        if args.health_check:
            if not args.spool_dir:
                parser.error("--health-check needs --spool-dir (the agent's)")
            return _health_check(args)
        if args.clear_latch:
            if not args.spool_dir:
                parser.error("--clear-latch needs --spool-dir (the stopped agent's)")
            return _clear_latch(args.spool_dir, args.clear_latch)
        if not (args.server and args.spool_dir and (args.token or args.token_file)):
            parser.error("--server, --token/--token-file and --spool-dir are required")
        if not args.upload_interval > 0:
            parser.error(f"--upload-interval must be > 0 seconds, not {args.upload_interval}")
        return run(args)
    except NvmlUnavailable as e:
        print(f"gpumeter-agent: NVML not found: {e}; {INSTALL_HINT}", file=sys.stderr)
        return 2


def run(args: argparse.Namespace) -> int:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: _request_stop(stop, signum))
    metrics = Metrics()
    clock = SystemClock()
    provider = _provider(args)
    spool = Spool(
        args.spool_dir,
        max_bytes=args.spool_max_bytes,
        max_held_bytes=args.spool_max_memory_bytes,
        batch_max_items=args.batch_max_records,
        seal_after_s=args.upload_interval,
        metrics=metrics,
    )
    uploader = Uploader(
        spool,
        args.server,
        _token(args),
        timeout_s=args.upload_timeout,
        interval_s=args.upload_interval,
        backoff=Backoff(cap_s=args.backoff_max),
        metrics=metrics,
        compress=not args.no_gzip,
    )
    schedule = UploadSchedule.jittered(args.upload_interval, args.upload_jitter_seed)
    upload_stop = threading.Event()
    upload_thread = threading.Thread(
        target=uploader.run, args=(upload_stop,), name="uploader", daemon=True
    )
    upload_thread.start()
    if args.metrics_port is not None:
        serve(metrics, args.metrics_port, args.metrics_host)
    gpus = provider.gpus()
    log.info(
        "agent_started", gpus=len(gpus), uuids=[g.uuid for g in gpus], spool=str(spool.root),
        upload_interval_s=schedule.interval_s, upload_offset_s=round(schedule.offset_s, 3),
        xid_catalog=CATALOG_VERSION,
    )  # fmt: skip
    runner = Runner(
        provider, spool, clock=clock, metrics=metrics, schedule=schedule,
        send_at=uploader.send_at, latches=LatchStore(args.spool_dir),
    )  # fmt: skip
    runner.run(stop, args.duration)

    runner.close()
    spool.seal(force=True)
    deadline = time.monotonic() + args.shutdown_upload_timeout
    uploader.wake()
    while spool.batches() and time.monotonic() < deadline:
        time.sleep(0.05)
    upload_stop.set()
    uploader.wake()
    upload_thread.join(timeout=args.upload_timeout + 1)
    provider.close()
    spool.close()
    log.info("agent_stopped", batches_left=len(spool.batches()), held=spool.held())
    return 0


def _request_stop(stop: threading.Event, signum: int) -> None:
    log.info("stop_requested", signal=signal.Signals(signum).name)
    stop.set()


if __name__ == "__main__":
    sys.exit(main())
