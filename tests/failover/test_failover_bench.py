"""bench/failover.py, tiny: real service, worker, agents and orchestrator, two failed and two
degraded GPUs; every fault is seen, moved and credited to the second, and the JSON line carries
the degraded -> running-on-spare figures (the p99 targets are the benchmark's to judge on a
quiet box: here only that the loop closes, within the run's own bound)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_the_failover_bench_runs_tiny_with_degraded_faults(pg_server_url: str) -> None:
    args = ["--nodes", "1", "--gpus-per-node", "8", "--failures", "2", "--degraded", "2"]
    args += ["--spread", "6", "--degraded-after", "5"]
    done = subprocess.run(
        [sys.executable, "failover.py", *args],
        cwd=BENCH, capture_output=True, text=True, timeout=300,
        env={**os.environ, "GPUMETER_DATABASE_URL": pg_server_url},
    )  # fmt: skip
    assert done.returncode in (0, 1), done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert (result["failures"], result["degraded"]) == (2, 2), result
    assert result["resumed"] == 4 and result["pass"]["credited_exact"], result
    assert result["degraded_resume_p99_s"] is not None, result
    assert result["expected_credited_s"] == result["credited_s"] > 0, result
