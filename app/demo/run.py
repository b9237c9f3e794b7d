"""``gpumeter demo``: the whole product on one machine, from an empty database to invoices.

Order: database -> migrations -> admin key -> ``gpumeter serve`` -> demo provider (console
API) -> last month backfilled by the simulator -> last month's invoices finalized -> two
``gpumeter-agent`` processes with simulated GPUs, one scripted to fail (XID 79) -> the demo,
as the orchestrator, sees the failure in fleet health and migrates the rental to a spare ->
at the end (``--duration`` or Ctrl-C): agents flushed, this month's draft invoices, a summary,
and every process it started stopped, the embedded Postgres last.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from types import FrameType
from typing import Any

import app.models  # noqa: F401 - registers every table, so foreign keys resolve
from app.auth.models import KeyKind
from app.auth.service import issue_key
from app.core import migrate
from app.core.db import get_engine, transaction
from app.core.epoch import epoch, from_epoch
from app.core.local_service import NotReady, port_in_use, wait_until_ready
from app.core.logging import configure_logging
from app.demo.processes import Child, Processes
from app.demo.provider import Api, create_provider
from app.demo.summary import PeriodSummary, summarise
from app.settings import get_settings
from app.simulate.history import SimGpu
from app.simulate.progress import Progress
from app.simulate.run import Options, simulate
from metering_agent.nvml.simulated import DEFAULT_MODEL

FAIL_AFTER_S = 20  # the scripted XID 79, seconds after the agents start
RESTART_S = 20  # the orchestrator's job restart on the spare: the credited migration window
BACKFILL_FAILURE_RATE = 0.03  # per GPU-day: enough that a small fleet shows failures
READY_TIMEOUT_S = 90

OpenDatabase = Callable[[Path], AbstractContextManager[str]]


@dataclass(frozen=True)
class DemoOptions:
    data_dir: Path | None
    duration: float | None
    port: int
    seed: int = 7
    verbose: bool = False  # stream the demo's and its children's JSON logs to the terminal


class Stopped(Exception):
    """SIGTERM: stop like Ctrl-C."""


def run_demo(options: DemoOptions, open_database: OpenDatabase) -> int:
    if port_in_use(options.port):
        print(
            f"gpumeter demo: port {options.port} is already in use (another gpumeter?); "
            "stop it or pass --port with a free port",
            file=sys.stderr,
        )
        return 2
    signal.signal(signal.SIGTERM, _raise_stopped)
    progress = Progress(sys.stdout)
    with workspace(options.data_dir) as directory, ExitStack() as stack:
        if not options.verbose:
            stack.enter_context(logs_to_file(directory / "demo.log"))
        processes = Processes(directory, stream_logs=options.verbose)
        with progress.step("starting Postgres (embedded unless GPUMETER_DATABASE_URL is set)"):
            url = stack.enter_context(open_database(directory))
        processes.extra_pids.update(postmaster_pid(directory))
        stack.callback(processes.stop_all)  # before the database stops
        demo = Demo(url, directory, processes, progress, options)
        stack.callback(demo.api_close)
        demo.prepare()
        try:
            demo.live(options.duration)
        except (KeyboardInterrupt, Stopped):
            progress.say("stopping (interrupted) ...")
        demo.finish()
    progress.say("all demo processes stopped")
    return 0


@contextmanager
def logs_to_file(path: Path) -> Iterator[None]:
    """The demo's own JSON logs into ``path``, so the terminal shows progress only (the CLI
    already keeps import-time info logs off it)."""
    level = get_settings().log_level
    with path.open("a") as log_file:
        configure_logging(level, stream=log_file)
        try:
            yield
        finally:  # the file goes with the workspace; what little follows, warnings only
            configure_logging("warning")


def _raise_stopped(_signum: int, _frame: FrameType | None) -> None:
    raise Stopped


@contextmanager
def workspace(data_dir: Path | None) -> Iterator[Path]:
    """``data_dir`` as given (kept), or a fresh temporary one removed at the end."""
    if data_dir is not None:
        data_dir.mkdir(parents=True, exist_ok=True)
        yield data_dir
        return
    directory = Path(tempfile.mkdtemp(prefix="gpumeter-demo-"))
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def postmaster_pid(directory: Path) -> dict[str, int]:
    pid_file = directory / "pgdata" / "postmaster.pid"
    if not pid_file.exists():
        return {}  # an external database: nothing of ours to stop
    return {"postgres": int(pid_file.read_text().split()[0])}


def program(script: str, module: str) -> list[str]:
    """The installed console script beside this interpreter, else ``python -m module``."""
    path = Path(sys.executable).parent / script
    return [str(path)] if path.exists() else [sys.executable, "-m", module]


def month_start(moment: datetime, back: int = 0) -> datetime:
    month = moment.year * 12 + moment.month - 1 - back
    return datetime(month // 12, month % 12 + 1, 1, tzinfo=UTC)


class Demo:
    def __init__(
        self,
        url: str,
        directory: Path,
        processes: Processes,
        progress: Progress,
        options: DemoOptions,
    ) -> None:
        self.url, self.directory, self.processes = url, directory, processes
        self.progress, self.options = progress, options
        self.base = f"http://127.0.0.1:{options.port}"
        # The demo's own signing secret: a served database needs one (`gpumeter serve`).
        secret = os.environ.get("GPUMETER_SECRET_KEY") or secrets.token_urlsafe(32)
        self.env = {**os.environ, "GPUMETER_DATABASE_URL": url, "GPUMETER_SECRET_KEY": secret}
        self.started = datetime.now(UTC)
        self.api: Api | None = None
        self.agents: list[Child] = []
        self.target = ""  # the GPU the fault script fails
        self.failed_at: int | None = None
        self.migrated = False

    # --- preparation ---------------------------------------------------------------------

    def prepare(self) -> None:
        step = self.progress.step
        with step("migrating the database"):
            migrate.upgrade(self.url)
        with step("creating an admin key"), transaction(get_engine(self.url)) as session:
            self.admin_key = issue_key(session, KeyKind.ADMIN, "demo operator").secret
        with step(f"starting the service on {self.base}"):
            self._serve()
        self.api = Api(self.base, self.admin_key)
        tag = datetime.now(UTC).strftime("%H%M%S")
        last_month = month_start(self.started, 1)
        with step("creating the demo provider through the API (plan, customers, nodes)"):
            self.provider = create_provider(self.api, tag, last_month)
        with step(f"backfilling history since {last_month:%Y-%m-%d} with the simulator"):
            self._backfill(last_month)
        with step(f"generating and finalizing {last_month:%Y-%m} invoices"):
            body = {"period": f"{last_month:%Y-%m}", "finalize": True, "force": True}
            self.api.post("/v1/invoices/runs", body)
        with step("starting 2 gpumeter-agent processes with simulated GPUs"):
            self._start_agents()
        self._announce()

    def _serve(self) -> None:
        argv = [*program("gpumeter", "app.cli"), "serve", "--port", str(self.options.port)]
        server = self.processes.start("server", argv, self.env)
        try:
            wait_until_ready(self.base, server.process, READY_TIMEOUT_S)
        except NotReady as error:
            raise RuntimeError(f"{error}; see {server.log_path}") from None

    def _backfill(self, since: datetime) -> None:
        end = int(time.time()) // 60 * 60
        options = Options(
            start=epoch(since),
            end=end,
            failure_rate=BACKFILL_FAILURE_RATE,
            seed=self.options.seed,
        )
        gpus = [SimGpu(gpu, DEFAULT_MODEL) for gpu in self.provider.gpus]
        quiet = Progress(quiet=True)
        with transaction(get_engine(self.url)) as session:
            self.backfill = simulate(session, gpus, options, quiet)
        self.progress.say(
            f"  {self.backfill.gpu_hours:,} GPU-hours, {self.backfill.failures} failures, "
            f"{self.backfill.migrations} migrations, {self.backfill.metric_rows:,} metric rows"
        )

    def _start_agents(self) -> None:
        self.target = self._open_gpu("Acme AI")
        target_node, index = self.provider.locate(self.target)
        faults = self.directory / "faults.json"
        faults.write_text(
            json.dumps([{"at": FAIL_AFTER_S, "gpu": index, "fault": "xid", "xid": 79}])
        )
        for i, node in enumerate(self.provider.nodes):
            token = self.directory / f"{node.hostname}.token"
            token.write_text(node.token)
            token.chmod(0o600)
            argv = [
                *program("gpumeter-agent", "metering_agent"),
                "--server", self.base,
                "--token-file", str(token),
                "--spool-dir", str(self.directory / f"spool-{node.hostname}"),
                "--simulate", str(len(node.gpus)),
                "--node-name", node.hostname,
                "--seed", str(i),
                "--upload-interval", "2",
            ]  # fmt: skip
            if node is target_node:
                argv += ["--faults", str(faults)]
            self.agents.append(self.processes.start(f"agent-{node.hostname}", argv, self.env))
        self.agents_started = int(time.time())

    def _open_gpu(self, customer: str) -> str:
        """A GPU the customer's rental holds now (the backfill may have moved it)."""
        rental = self.api_get(f"/v1/rentals/{self.provider.rentals[customer]}")
        return next(a["gpu_uuid"] for a in rental["assignments"] if a["end_at"] is None)

    def _announce(self) -> None:
        acme = self.provider.customers["Acme AI"]
        link = self.api_post(f"/v1/customers/{acme}/portal-links", {"ttl_s": 86_400})["url"]
        pids = ", ".join(f"{name} {pid}" for name, pid in self.processes.pids().items())
        duration = self.options.duration
        stop = f"stops after {duration:g} s" if duration else "runs until Ctrl-C"
        self.progress.say(
            "\n"
            "gpumeter demo is running\n"
            f"  dashboard link (Acme AI): {link}\n"
            f"  admin key:                {self.admin_key}\n"
            f"  API docs:                 {self.base}/docs\n"
            f"  processes:                {pids} (in {self.directory / 'state.json'})\n"
            f"  in ~{FAIL_AFTER_S} s GPU {self.target} fails (XID 79); the demo then moves "
            "Acme AI's rental to a spare\n"
            f"  the demo {stop}\n"
        )

    # --- live -----------------------------------------------------------------------------

    def live(self, duration: float | None) -> None:
        deadline = None if duration is None else time.monotonic() + duration
        while deadline is None or time.monotonic() < deadline:
            self._check_children()
            self._orchestrate()
            time.sleep(1)

    def _check_children(self) -> None:
        for child in self.processes.children:
            if child.process.poll() is not None:
                raise RuntimeError(f"{child.name} exited early; see {child.log_path}")

    def _orchestrate(self) -> None:
        """Play the orchestrator: spot the failed GPU, restart the job on a spare."""
        if self.migrated:
            return
        if self.failed_at is None:
            health = self.api_get("/v1/fleet/health")
            for failed in health["recently_failed"]:
                since = epoch(datetime.fromisoformat(failed["since"]))
                if failed["gpu_uuid"] == self.target and since >= self.agents_started:
                    self.failed_at = since
                    rule = (failed["evidence"] or {}).get("rule", "failed")
                    self.progress.say(f"GPU {self.target} failed ({rule}); restarting the job")
            return
        if time.time() >= self.failed_at + RESTART_S:
            self._migrate()

    def _migrate(self) -> None:
        spare = self._free_gpu()
        rental = self.provider.rentals["Acme AI"]
        self.api_post(
            f"/v1/rentals/{rental}/migrations",
            {
                "from_gpu_uuid": self.target,
                "to_gpu_uuid": spare,
                "failed_at": from_epoch(self.failed_at or 0).isoformat(),
                "resumed_at": from_epoch(int(time.time())).isoformat(),
                "reason": "XID 79: GPU fell off the bus",
            },
        )
        self.migrated = True
        self.progress.say(f"Acme AI's rental resumed on GPU {spare}; the downtime is credited")

    def _free_gpu(self) -> str:
        held = {
            a["gpu_uuid"]
            for rental in self.api_get("/v1/rentals", limit=100)["items"]
            for a in rental["assignments"]
            if a["end_at"] is None
        }
        free = [g for g in self.provider.gpus if g not in held and g != self.target]
        if not free:
            raise RuntimeError("no free GPU to migrate to")
        return free[0]

    # --- end ------------------------------------------------------------------------------

    def finish(self) -> None:
        for agent in self.agents:  # they upload what they spooled before the service stops
            self.processes.stop(agent)
        period = f"{self.started:%Y-%m}"
        with self.progress.step(f"generating {period} draft invoices (to date)"):
            self.api_post("/v1/invoices/runs", {"period": period})
        periods = [f"{month_start(self.started, 1):%Y-%m}", period]
        summaries = [summarise(self._invoices(p), p) for p in periods]
        self._print_summary(summaries)

    def _invoices(self, period: str) -> list[dict[str, Any]]:
        listed = self.api_get("/v1/invoices", period=period, limit=100)["items"]
        return [self.api_get(f"/v1/invoices/{invoice['id']}") for invoice in listed]

    def _print_summary(self, summaries: list[PeriodSummary]) -> None:
        live = sum((s.credited_on(self.target, self.agents_started) for s in summaries), Decimal(0))
        lines = ["", "summary"] + [f"  {s.line()}" for s in summaries]
        lines.append(f"  live failure credit (GPU {self.target}): USD {live:.2f}")
        lines.append(f"  backfill: {self.backfill.failures} simulated failures, "
                     f"{self.backfill.migrations} migrations to spares")  # fmt: skip
        self.progress.say("\n".join(lines) + "\n")

    # --- API --------------------------------------------------------------------------------

    def api_get(self, path: str, **params: Any) -> Any:
        assert self.api is not None
        return self.api.get(path, **params)

    def api_post(self, path: str, body: dict[str, Any]) -> Any:
        assert self.api is not None
        return self.api.post(path, body)

    def api_close(self) -> None:
        if self.api is not None:
            self.api.close()
