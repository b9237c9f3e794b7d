"""Each benchmark this round's ingest work owns runs in a tiny configuration, so a bench that
stops running (a refused batch, a renamed function, a changed answer) fails CI rather than the
next person to measure. Only that they run and print their figures: the figures themselves
are for a quiet box (bench/README.md). bench/failover.py, slurm_scale.py, forecast.py and
invoices.py have tests of their own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
pytestmark = pytest.mark.e2e


def run_bench(server: str, script: str, *args: str, ok: tuple[int, ...] = (0,)) -> Any:
    """The bench's final JSON line (it exits with one of ``ok``)."""
    done = subprocess.run(
        [sys.executable, script, *args],
        cwd=BENCH, capture_output=True, text=True, timeout=240,
        env={**os.environ, "GPUMETER_DATABASE_URL": server},
    )  # fmt: skip
    assert done.returncode in ok, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_the_ingest_bench_reports_gpus_per_core(pg_server_url: str) -> None:
    tiny = ["--phases", "rate", "--rate-nodes", "8", "--fleet-nodes", "8", "--workers", "1"]
    tiny += ["--phase-s", "2", "--settle-s", "1", "--copy-rows", "2000"]
    result = run_bench(pg_server_url, "ingest.py", *tiny, ok=(0, 1))
    rate = result["headline"]["rate"]
    assert rate["batches_per_s"] > 0 and rate["gpus_per_core"] > 0, result
    assert rate["share_of_copy"] is not None and rate["cpu_ms_per_batch"]["postgres"] > 0


def test_the_in_process_ingest_bench_runs(pg_server_url: str) -> None:
    tiny = ["--nodes", "8", "--group", "4", "--rounds", "2", "--parse-repeats", "20"]
    result = run_bench(pg_server_url, "ingest_cpu.py", *tiny)
    assert result["batches"] == 16, result
    assert result["service_ms"] > 0 and result["parse_us"] > 0, result


def test_the_scaleout_bench_reports_what_one_postgres_takes(pg_server_url: str) -> None:
    tiny = ["--workers-list", "1", "--seconds", "2", "--nodes", "16", "--concurrency", "4"]
    result = run_bench(pg_server_url, "scaleout.py", *tiny)
    assert result["postgres_cpu_ms_per_batch"] > 0, result
    assert result["postgres_limit_gpus_by_upload_interval_s"]["10"] > 0, result


def test_the_overload_bench_runs(pg_server_url: str) -> None:
    tiny = ["--nodes", "40", "--senders", "1", "--workers", "1", "--overload-s", "2"]
    tiny += ["--warm-s", "1", "--sustainable-s", "2"]
    result = run_bench(pg_server_url, "overload.py", *tiny, ok=(0, 1))  # tiny may not overload
    assert result["sustainable_rps"] > 0 and result["other_5xx"] == 0, result
    assert result["stored_gpu_seconds"] == result["accepted_gpu_seconds"], result


def test_the_agent_bench_runs(pg_server_url: str) -> None:
    result = run_bench(pg_server_url, "agent.py", "--seconds", "2", "--warmup", "1", "--gpus", "8")
    assert result, result
