"""bench/forecast.py runs (so it cannot silently stop working) and meets its goal: the month-end
forecast made on days 10, 15 and 20 is within 5 % of the final invoice in every scenario."""

from __future__ import annotations

import json
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "forecast.py"
SCENARIOS = {"steady", "growth", "failure_burst", "ending"}


def test_the_forecast_bench_meets_its_goal_in_every_scenario() -> None:
    ran = subprocess.run(
        [sys.executable, str(BENCH), "--scale", "1"], capture_output=True, text=True, timeout=300
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    result = json.loads(ran.stdout.strip().splitlines()[-1])
    assert set(result["scenarios"]) == SCENARIOS
    for name, row in result["scenarios"].items():
        errors = row["error_percent"]
        assert set(errors) == {"5", "10", "15", "20"}, name
        assert all(abs(errors[d]) <= 5 for d in ("10", "15", "20")), (name, errors)
    # The steady month and the booked end are known in full on day 5 already: exact.
    for name in ("steady", "ending"):
        assert set(result["scenarios"][name]["error_percent"].values()) == {0.0}, name
    # Only the growing customer is forecast rentals it has not made yet.
    for name, row in result["scenarios"].items():
        new = {Decimal(v) for v in row["of_which_new_rentals"].values()}
        assert (min(new) > 0) if name == "growth" else new == {Decimal(0)}, (name, new)
    assert result["met"] is True
    assert "day 10" in ran.stderr  # the table a person reads
