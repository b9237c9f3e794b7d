"""Simulator benchmark: `gpumeter simulate` (the real command) on a fresh database.

Creates a database on the server of GPUMETER_DATABASE_URL (default
postgresql://postgres@127.0.0.1:5432/postgres), runs ``gpumeter simulate --gpus N --days D``
in it, prints the command's progress, its wall time and the tables' sizes as one JSON line,
and drops the database.
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
    args = parser.parse_args()
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
        print(json.dumps({**report, "wall_seconds": round(wall, 1), "bytes": sizes}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
