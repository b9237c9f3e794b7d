"""Each benchmark runs in a tiny configuration, so a bench that stops running (a refused batch,
a renamed function, a changed answer) fails CI rather than the next person to measure. Only
that they run and print their figures, with the counts they were given: the figures themselves
are for a quiet box (bench/README.md). bench/failover.py, slurm_scale.py, slurm_failover.py
and forecast.py have tests of their own, beside their subjects."""

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
    # A 2-s run counts the agent's CPU in 10-ms ticks: one tick more under CI's load is half a
    # percent of a core, so its CPU target (exit 1) is the full run's to judge, not this one's.
    tiny = ("--seconds", "2", "--warmup", "1", "--gpus", "8")
    result = run_bench(pg_server_url, "agent.py", *tiny, ok=(0, 1))
    eight = next(r for r in result["results"] if not r["options"])  # gzip, as the agent sends
    # (2 s holds no upload: the agent uploads every 10 s)
    assert eight["gpus"] == 8 and eight["rss_mib"] > 0 and eight["cpu_percent_of_core"] >= 0, eight
    assert result["nvml_calls_target_met"], result["nvml_calls_per_gpu_second"]


def test_the_http_floor_bench_runs(pg_server_url: str) -> None:
    # 40 nodes, not 8: a batch costs the floor ~1 ms and the CPU clock ticks every 10 ms.
    tiny = ["--phases", "floor", "--rate-nodes", "40", "--fleet-nodes", "8", "--workers", "1"]
    tiny += ["--phase-s", "3", "--settle-s", "1", "--copy-rows", "0"]
    floor = run_bench(pg_server_url, "ingest.py", *tiny)["floor"]  # bench/http_floor.py
    assert floor["nodes"] == 40 and floor["offered_batches_per_s"] == 20.0, floor  # every 2 s
    assert floor["batches_per_s"] > 0 and floor["errors"] == {}, floor
    assert floor["cpu_ms_per_batch"]["service"] > 0, floor


DASHBOARD_PAGES = {"overview", "rental", "invoices", "what_if", "costs", "costs_by_dc"}
DASHBOARD_PAGES |= {"usage_csv", "focus_csv", "usage_api", "invoice", "invoice_pdf"}


def test_the_dashboard_bench_runs_both_customers(pg_server_url: str) -> None:
    tiny = ["--gpus", "8", "--big-gpus", "16", "--runs", "1"]
    result = run_bench(pg_server_url, "dashboard.py", *tiny, ok=(0, 1))  # a busy box may miss
    assert result["small"]["gpus"] == 8 and result["big"]["gpus"] == 16, result
    pages = result["pages"]
    assert set(pages["small"]) == DASHBOARD_PAGES, pages
    assert set(pages["big"]) == DASHBOARD_PAGES | {"open_span_refresh"}, pages
    timed = [*pages["small"].values(), *pages["big"].values()]
    assert all(page["median_ms"] > 0 and page["bytes"] > 0 for page in timed), pages
    assert len(result["targets"]) == len(DASHBOARD_PAGES) - 1 + 5, result  # usage_api: none


def test_the_invoices_bench_drafts_every_customer(pg_server_url: str) -> None:
    tiny = ["--scales", "1", "--gpus", "40", "--customers", "6", "--big-gpus", "16"]
    result = run_bench(pg_server_url, "invoices.py", *tiny)
    month, big = result["1x"], result["big_customer"]
    assert month["gpus"] == 40 and month["drafted"] == 6, result
    assert month["rows"]["customers"] == 6 and month["rows"]["rentals"] == 20, result  # 2 GPUs
    assert big["gpus"] == 16 and big["drafted"] == 1 and big["rows"]["rentals"] == 2, result
    assert month["seconds"] > 0 and big["seconds"] > 0, result
    assert "big_customer_met" not in result and "30k_gpus_met" not in result, result


def test_the_storage_bench_runs(pg_server_url: str) -> None:
    tiny = ["--hours", "2", "--gpus", "16", "--agent-gpus", "1", "--agent-upload-s", "20"]
    # Tiny, a page more or less is hundreds of bytes per GPU-hour: the target may be missed.
    result = run_bench(pg_server_url, "storage.py", *tiny, ok=(0, 1))
    cadence, volume = result["cadence_run"], result["volume_run"]
    # A record per GPU per round: every 20 s over 2 hours (360), and every minute (120), and
    # the round that closes the last hour.
    assert cadence["upload_s"] == 20 and cadence["records"] == 1 * (360 + 1), result
    assert volume["records"] == 16 * (120 + 1), result
    assert volume["growth_bytes"]["gpu_minute_metrics"] > 0, result
    assert result["bytes_per_gpu_hour"] == volume["bytes_per_gpu_hour"] > 0, result


def test_the_simulate_bench_runs(pg_server_url: str) -> None:
    result = run_bench(pg_server_url, "simulate.py", "--gpus", "8", "--days", "1")
    assert result["gpus"] == 8 and result["gpu_hours"] == 8 * 24, result
    assert result["bytes"]["gpu_state_segments"] > 0 and result["wall_seconds"] > 0, result


def test_the_simulate_bench_replays_a_scenario(pg_server_url: str) -> None:
    result = run_bench(pg_server_url, "simulate.py", "--scenario", "seed", "--scale", "0.01")
    assert result["gpus"] == 30, result  # the seed's 3,000 GPUs at 1 %
    assert result["rented_s"] == 30 * 60 * 86_400, result  # for 60 days
    assert result["wall_seconds"] > 0, result


def test_the_webhooks_bench_delivers_every_event(pg_server_url: str) -> None:
    result = run_bench(pg_server_url, "webhooks.py", "--events", "20", "--rate", "50")
    assert result["events"] == 20 and result["delivered"] == 20, result
    assert result["rejected"] == 0 and result["p99_ms"] > 0, result
