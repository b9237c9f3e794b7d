"""bench/slurm_scale.py, tiny: it runs end to end on a fresh database, every job attributed
without a problem, and prints its figures as the final JSON line (the 10,000-job figures are
the benchmark's, not a timed assertion a busy machine would fail)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_the_scale_bench_runs_tiny(pg_server_url: str) -> None:
    done = subprocess.run(
        [sys.executable, "slurm_scale.py", "--jobs", "40", "--rounds", "2", "--churn", "0.05"],
        cwd=BENCH, capture_output=True, text=True, timeout=240,
        env={**os.environ, "GPUMETER_DATABASE_URL": pg_server_url},
    )  # fmt: skip
    assert done.returncode in (0, 1), done.stderr[-2000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert (result["jobs"], result["rounds"]) == (40, 2)
    assert result["cold_start"]["attributed"] == 40 and result["problems"] == 0
    assert result["steady_bytes_posted_p50"] > 0 and result["steady_service_cpu_ms_p50"] > 0
