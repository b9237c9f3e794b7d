"""``gpumeter-slurm``: the Slurm adapter, run beside slurmctld with a scheduler key.

It talks to gpumeter over its API only (no database), so it runs on the controller host with
nothing but the Slurm client commands and this package."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from app.core.console_client import Api
from app.core.logging import configure_logging
from app.slurm.adapter import Adapter, AdapterConfig
from app.slurm.scheduler import DEFAULT_TIMEOUT_S, Slurm

API_TIMEOUT_S = 10.0
DEFAULT_SLURM_CONF = Path("/etc/slurm/slurm.conf")  # Debian's and SchedMD's packages


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpumeter-slurm",
        description="Attribute Slurm jobs to gpumeter rentals and carry out gpumeter's "
        "failovers in Slurm (drain, requeue onto the hot spare, resume); holds the hot spares "
        "in a reservation. Stops on SIGTERM.",
    )
    p.add_argument("--server", required=True, help="gpumeter's base URL, e.g. http://meter:8000")
    key = p.add_mutually_exclusive_group(required=True)
    key.add_argument(
        "--token",
        help="a scheduler key, from POST /v1/keys/scheduler (prefer --token-file: argv is "
        "visible to other users)",
    )
    key.add_argument("--token-file", type=Path, help="file holding the scheduler key")
    p.add_argument("--cluster", required=True, help="this cluster's name in gpumeter")
    p.add_argument(
        "--spare-reservation",
        default="gpumeter_spares",
        help="the Slurm reservation (users: root) that holds gpumeter's hot spares so no "
        "customer job lands on them; the adapter creates it and keeps its nodes in step "
        "(default: gpumeter_spares)",
    )
    p.add_argument("--slurm-conf", type=Path, help="slurm.conf (default: Slurm's own lookup)")
    p.add_argument(
        "--gres-conf",
        type=Path,
        help="the gres.conf slurmd reads, for which device file (so which GPU) each GRES index "
        "is (default: gres.conf beside --slurm-conf, else /etc/slurm/gres.conf)",
    )
    p.add_argument(
        "--poll-interval", type=float, default=1.0, help="seconds between rounds (default: 1)"
    )
    p.add_argument(
        "--resume-deadline",
        type=float,
        default=90.0,
        help="seconds a failed-over job may take to run on the spare before the failover is "
        "abandoned (default: 90; keep it below the service's reservation time to live)",
    )
    p.add_argument(
        "--slurm-timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help=f"seconds one Slurm command may take (default: {DEFAULT_TIMEOUT_S:g})",
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.poll_interval <= 0 or args.resume_deadline <= 0 or args.slurm_timeout <= 0:
        print("gpumeter-slurm: intervals, deadlines and timeouts must be > 0", file=sys.stderr)
        return 2
    token = args.token if args.token_file is None else args.token_file.read_text().strip()
    configure_logging(args.log_level)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per call, every round
    config = AdapterConfig(
        cluster=args.cluster,
        spare_reservation=args.spare_reservation,
        poll_s=args.poll_interval,
        resume_deadline_s=args.resume_deadline,
        gres_conf=args.gres_conf or (args.slurm_conf or DEFAULT_SLURM_CONF).parent / "gres.conf",
    )
    api = Api(args.server, token, timeout_s=API_TIMEOUT_S)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        Adapter(api, Slurm(args.slurm_conf, args.slurm_timeout), config).run(stop)
    finally:
        api.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
