"""`gpumeter demo` as a user runs it, its failure and restart brought forward: exit 0, a summary
with a credit for the scripted failure, a dashboard link that opens in headless Chromium while
the demo runs, and nothing it started left running afterwards."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from decimal import Decimal
from pathlib import Path

import pytest

from app.core.local_service import free_port
from tests.dashboard.test_browser import ARGS, CHROMIUM
from tests.test_cli import env_without_database

pytestmark = pytest.mark.e2e

from playwright.sync_api import sync_playwright  # noqa: E402

GPUMETER = Path(sys.executable).parent / "gpumeter"
# The GPU fails 4 s after the agents start, its job resumes RESTART_S later; the agents upload
# every 2 s, so 16 s leaves the credit's close a few uploads to arrive.
RESTART_S = 4
SHORT_RUN = ["--duration", "16", "--fail-after", "4", "--restart-after", str(RESTART_S)]
LINK = re.compile(r"dashboard link \(Acme AI\): (\S+)")
LIVE_STORY = re.compile(r"live failure: .* resumed after (\d+) s, credited (\d+) s \(USD [\d.]+\)")
LAST_MONTH = re.compile(r"\d{4}-\d{2}: (\d+) invoices \(finalized\), GPU-hours billed ([\d,.]+)")


class Demo:
    """The demo process, its output collected line by line as it comes."""

    def __init__(self, data_dir: Path, env: dict[str, str]) -> None:
        self.data_dir = data_dir
        argv = [str(GPUMETER), "demo", "--port", str(free_port()), *SHORT_RUN]
        self.process = subprocess.Popen(
            [*argv, "--data-dir", str(data_dir)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,  # the terminal: progress and summary, no logs
            text=True,
        )
        self.lines: list[str] = []
        self.link = threading.Event()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)
            if LINK.search(line):
                self.link.set()

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def pids(self) -> dict[str, int]:
        return json.loads((self.data_dir / "state.json").read_text())["pids"]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(")")[-1].split()[0] != "Z"


def open_dashboard(link: str) -> tuple[str, str]:
    """The overview the link opens, and the budgets page (the demo seeds Acme's budget)."""
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page()
            response = page.goto(link)
            assert response is not None and response.ok, response and response.status
            overview = page.content()
            page.get_by_role("link", name="Budgets").click()
            page.wait_for_url("**/dashboard/budgets")
            return overview, page.content()
        finally:
            browser.close()


@pytest.mark.parametrize("database", ["embedded", "configured"])
def test_demo_runs_shows_the_dashboard_and_leaves_nothing_behind(
    database: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    env = env_without_database()
    if database == "configured":
        request.getfixturevalue("db")  # empties the run's database: the demo counts its own
        env["GPUMETER_DATABASE_URL"] = request.getfixturevalue("database_url")
    demo = Demo(tmp_path / "demo", env)
    try:
        assert demo.link.wait(180), f"no dashboard link printed:\n{demo.output}"
        pids = demo.pids()
        link = LINK.search(demo.output)
        assert link, demo.output
        html, budgets = open_dashboard(link.group(1))
        assert "Acme AI" in html
        assert "$6,500.00" in budgets and "90 % of forecast" in budgets, budgets
        assert demo.process.wait(240) == 0, demo.output
    finally:
        if demo.process.poll() is None:
            demo.process.kill()
    demo.reader.join(10)
    assert not demo.reader.is_alive() and demo.process.stdout is not None
    demo.process.stdout.close()  # read to its end: closed here, not by the garbage collector
    output = demo.output
    story = LIVE_STORY.search(output)
    assert story, output
    resumed_after, credited = map(int, story.groups())
    # At least the orchestrator's restart is credited; the failure is cut within a second.
    assert resumed_after >= RESTART_S and credited >= RESTART_S, output
    last_month = LAST_MONTH.search(output)
    assert last_month, output
    invoices, billed = last_month.groups()
    assert int(invoices) == 3 and Decimal(billed.replace(",", "")) > 0
    assert "all demo processes stopped" in output
    assert {"server", *(n for n in pids if n.startswith("agent-"))} <= set(pids)
    assert ("postgres" in pids) == (database == "embedded")
    assert not [name for name, pid in pids.items() if alive(pid)], pids
    assert not (demo.data_dir / "pgdata" / "postmaster.pid").exists()
    assert not [line for line in demo.lines if line.startswith("{")], "JSON logs on the terminal"
    logs = {"demo.log", "server.log", *(f"{name}.log" for name in pids if "agent" in name)}
    assert all((demo.data_dir / log).stat().st_size > 0 for log in logs), logs
