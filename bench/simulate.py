"""Simulator benchmark: `gpumeter simulate` (the real command) on a fresh database.

Creates a database on the server of GPUMETER_DATABASE_URL (default
postgresql://postgres@127.0.0.1:5432/postgres), runs ``gpumeter simulate --gpus N --days D``
in it, prints the command's progress, its wall time and the tables' sizes as one JSON line,
and drops the database. With ``--scenario NAME [--scale S]`` it times the scenario replay
instead (which makes and drops its own database) and prints its figures with the wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from app.core.scratch_db import scratch_database, server_from_environment, table_bytes

SCENARIO_TARGET_S = 180  # the seed's 3,000 GPUs x 60 days, on 2 cores
DEFAULT_TARGET_S = 60  # 3,000 GPUs x 30 days (the defaults)
METERING_TABLES = (
    "gpu_state_segments",
    "gpu_minute_metrics",
    "gpu_minute_metrics_open",
    "health_events",
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=3000)
    parser.add_argument("--days", type=float, default=30)
    parser.add_argument("--recovery", choices=["auto", "manual"], default="auto")
    parser.add_argument("--scenario", choices=["seed", "llama3"], default=None)
    parser.add_argument("--scale", type=float, default=1.0, help="with --scenario")
    args = parser.parse_args()
    if args.scenario is not None:
        return scenario(args.scenario, args.scale)
    # Unmigrated: `gpumeter simulate` migrates, and that is part of the time it takes.
    with scratch_database(server_from_environment(), "gpumeter_bench_sim", migrated=False) as url:
        gpumeter = Path(sys.executable).parent / "gpumeter"
        argv = [str(gpumeter), "simulate", "--gpus", str(args.gpus), "--days", str(args.days)]
        env = {**os.environ, "GPUMETER_DATABASE_URL": url, "GPUMETER_LOG_LEVEL": "warning"}
        began = time.monotonic()
        result = subprocess.run(
            [*argv, "--recovery", args.recovery], env=env, check=True, capture_output=True
        )
        wall = time.monotonic() - began
        sys.stderr.write(result.stderr.decode())
        report = json.loads(result.stdout.decode().strip().splitlines()[-1])
        sizes = table_bytes(url, METERING_TABLES)
    target = DEFAULT_TARGET_S if (args.gpus, args.days) == (3000, 30) else None
    met = target is None or wall < target
    print(
        json.dumps(
            {**report, "wall_seconds": round(wall, 1), "bytes": sizes, "target_seconds": target}
            | {"met": met}
        )
    )
    return 0 if met else 1


def scenario(name: str, scale: float) -> int:
    """``gpumeter simulate --scenario NAME``: its figures, wall time and the target."""
    gpumeter = Path(sys.executable).parent / "gpumeter"
    env = {
        **os.environ,
        "GPUMETER_DATABASE_URL": server_from_environment(),
        "GPUMETER_LOG_LEVEL": "warning",
    }
    argv = [str(gpumeter), "simulate", "--scenario", name, "--scale", str(scale)]
    began = time.monotonic()
    result = subprocess.run(argv, env=env, check=True, capture_output=True)
    wall = time.monotonic() - began
    sys.stderr.write(result.stderr.decode())
    figures = json.loads(result.stdout.decode().strip().splitlines()[-1])
    print(result.stdout.decode(), end="")
    target = SCENARIO_TARGET_S if name == "seed" and scale == 1 else None
    met = target is None or wall < target
    print(
        json.dumps(
            {**figures, "wall_seconds": round(wall, 1), "target_seconds": target, "met": met}
        )
    )
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
