"""``gpumeter simulate --scenario``: the printed figures are what independent arithmetic on the
stored rows gives, to the second and the cent; the output depends on the seed alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator
from decimal import ROUND_HALF_UP, Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, text

from app.billing.usage import UsageSettings
from app.cli import build_parser
from app.core.db import transaction
from app.core.scratch_db import scratch_database
from app.metering.reads import minute_rows
from app.settings import get_settings, sqlalchemy_url
from app.simulate.progress import Progress
from app.simulate.replay import Replay, replay
from app.simulate.replay_report import figures, render
from app.simulate.scenarios import LLAMA3, SEED, expected

# One xdist group: the module's replay (``stored``) runs once, not on every worker.
pytestmark = pytest.mark.xdist_group("replay")

SCALE = 0.01  # 30 A100s for 60 days: ~13 failures expected
Span = tuple[int, int]


@pytest.fixture(scope="module")
def replay_url(pg_server_url: str) -> Iterator[str]:
    """A database of this module's own: other tests empty the shared one before each test."""
    with scratch_database(pg_server_url, "gpumeter_test_replay") as url:
        yield url


@pytest.fixture(scope="module")
def stored(replay_url: str) -> Replay:
    """The scenario replayed once for the module's checks (a few seconds)."""
    idle_below = UsageSettings.of(get_settings()).idle_below_tenths
    return replay(replay_url, SEED, SCALE, 5, Progress(quiet=True), idle_below)


@pytest.fixture(scope="module")
def db(replay_url: str) -> Iterator[Engine]:
    engine = create_engine(sqlalchemy_url(replay_url))
    yield engine
    engine.dispose()


def rows(db: Engine, sql: str) -> list[Any]:
    with db.connect() as conn:
        return list(conn.execute(text(sql)))


def merged(spans: list[Span]) -> list[Span]:
    out: list[Span] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def overlap(span: Span, others: list[Span]) -> int:
    return sum(max(0, min(span[1], b) - max(span[0], a)) for a, b in others)


def minus(span: Span, holes: list[Span]) -> list[Span]:
    pieces, cursor = [], span[0]
    for a, b in merged(holes):
        if b <= cursor or a >= span[1]:
            continue
        if a > cursor:
            pieces.append((cursor, a))
        cursor = max(cursor, b)
    if cursor < span[1]:
        pieces.append((cursor, span[1]))
    return pieces


def cents(seconds: int, price: str) -> Decimal:
    exact = Fraction(seconds) * Fraction(price) / 3600
    return (Decimal(exact.numerator) / exact.denominator).quantize(Decimal("0.01"), ROUND_HALF_UP)


class Stored:
    """The rental's rows, read with plain SQL."""

    def __init__(self, db: Engine) -> None:
        epoch = "extract(epoch FROM {})::bigint"
        self.assignments: dict[str, list[Span]] = defaultdict(list)
        for gpu, a, b in rows(
            db,
            f"SELECT gpu_uuid, {epoch.format('start_at')}, {epoch.format('end_at')}"
            " FROM gpu_assignments",
        ):
            self.assignments[gpu].append((a, b))
        self.windows: dict[str, list[Span]] = defaultdict(list)
        for gpu, a, b in rows(
            db,
            f"SELECT from_gpu_uuid, {epoch.format('failed_at')}, {epoch.format('resumed_at')}"
            " FROM rental_migrations",
        ):
            self.windows[gpu].append((a, b))
        self.failed: dict[str, list[Span]] = defaultdict(list)
        for gpu, a, b in rows(
            db, "SELECT gpu_uuid, start, \"end\" FROM gpu_state_segments WHERE state = 'failed'"
        ):
            self.failed[gpu].append((a, b))

    def sessions(self) -> list[tuple[str, Span]]:
        return [(gpu, s) for gpu, spans in self.assignments.items() for s in merged(spans)]

    def billed(self) -> list[tuple[str, list[Span]]]:
        """Each session's billable spans: the GPU not failed."""
        return [(gpu, minus(s, self.failed[gpu])) for gpu, s in self.sessions()]

    def incidents(self) -> list[Span]:
        out = []
        for gpu in set(self.windows) | set(self.failed):
            down = list(self.windows[gpu])
            for s in merged(self.assignments[gpu]):
                down += [(max(a, s[0]), min(b, s[1])) for a, b in self.failed[gpu]]
            out += merged([d for d in down if d[0] < d[1]])
        return out


def test_the_table_is_independent_arithmetic_on_the_stored_rows(db: Engine, stored: Replay) -> None:
    printed = figures(stored, SCALE, 5)
    data = Stored(db)
    price, manual_s = SEED.price_per_hour, SEED.manual_recovery_s
    incidents = data.incidents()
    credited = sum(b - a for a, b in incidents)
    rented = sum(b - a for _, s in data.sessions() for a, b in [s]) + sum(
        b - a for spans in data.windows.values() for a, b in spans
    )
    assert stored.report.migrations > 5 and len(incidents) == printed["incidents"]
    assert printed["rented_s"] == rented == 30 * 60 * 86_400
    assert printed["credited_s"] == credited
    top_ups = [max(manual_s - (b - a), 0) for a, b in incidents]
    assert printed["manual_downtime_s"] == credited + sum(top_ups)
    for row in printed["rows"]:
        step = row["increment_s"]
        billed = [sum(b - a for a, b in spans) for _, spans in data.billed()]
        charged = sum(-(-s // step) * step for s in billed if s)
        assert row["automatic"] == {"amount": str(cents(charged, price)), "billed_s": charged}
        manual = cents(charged + credited, price) + sum(cents(t, price) for t in top_ups)
        assert row["manual"] == {
            "amount": str(manual),
            "billed_s": charged + credited + sum(top_ups),
        }


def test_idle_is_measured_from_the_stored_minutes(db: Engine, stored: Replay) -> None:
    """Minutes whose mean utilisation is below 1 %, decoded by the packing module (not the
    idle reader billing uses), inside the billed spans."""
    data = Stored(db)
    span = stored.span
    with transaction(db) as session:
        minutes = minute_rows(session, sorted(data.assignments), *span)
    idle = {
        gpu: merged([(m.start, m.start + 60) for m in ms if m.util_n and m.util_sum < m.util_n])
        for gpu, ms in minutes.items()
    }
    idle_s = sum(overlap(s, idle[gpu]) for gpu, spans in data.billed() for s in spans)
    printed = figures(stored, SCALE, 5)
    assert printed["idle_s"] == idle_s
    assert 0.15 < idle_s / printed["rented_s"] < 0.22  # 18.4 % of GPU-hours drawn idle
    effective = printed["rented_s"] - printed["credited_s"] - idle_s
    assert printed["effective_s"] == {
        "automatic": effective,
        "manual": effective + printed["credited_s"] - printed["manual_downtime_s"],
    }


def test_the_printed_table_shows_the_rated_figures(stored: Replay) -> None:
    text_ = "\n".join(render(stored, SCALE, 5))
    for row in figures(stored, SCALE, 5)["rows"]:
        for column in ("automatic", "manual"):
            assert f"{Decimal(row[column]['amount']):,.2f}" in text_
    assert "(equals the rated" in text_
    assert "30 x 60 d x 0.720000% = 12.96" in text_


def test_expected_arithmetic_of_the_seed_inputs() -> None:
    e = expected(SEED, 3000)
    assert e.failures == 1296 and e.manual_downtime_gpu_h == Fraction(1296 * 47, 60)
    assert e.rented_gpu_h == 4_320_000 and e.idle_gpu_h == Fraction(794_880)
    assert e.cost_all_rented == Decimal("12096000.00")
    assert expected(LLAMA3, 16_384).failures == 419


def run_cli(server: str, *argv: str) -> subprocess.CompletedProcess[str]:
    gpumeter = Path(sys.executable).parent / "gpumeter"
    env = {**os.environ, "GPUMETER_DATABASE_URL": server, "GPUMETER_LOG_LEVEL": "warning"}
    return subprocess.run(
        [str(gpumeter), "simulate", *argv], env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.e2e
def test_the_command_prints_the_same_for_a_seed(pg_server_url: str) -> None:
    """Two runs, two databases: a fixed window and names derived from the seed alone."""
    first, again = (run_cli(pg_server_url, "--scenario", "seed", "--scale", "0.003") for _ in "12")
    assert first.returncode == again.returncode == 0, first.stderr
    assert first.stdout == again.stdout
    assert json.loads(first.stdout.splitlines()[-1])["gpus"] == 9
    assert "replayed in" in first.stderr  # the time goes to stderr, not into the output


def test_help_and_refused_combinations(capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(["simulate", "--help"])
    assert exit_.value.code == 0
    help_ = capsys.readouterr().out
    assert "--scenario {seed,llama3}" in help_ and "--scale" in help_ and "--keep" in help_
    args = parser.parse_args(["simulate", "--scenario", "seed", "--gpus", "10"])
    assert args.handler(args) == 2
    assert "--gpus: not with --scenario" in capsys.readouterr().err
