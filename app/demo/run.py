"""``gpumeter demo``: the whole product on one machine, from an empty database to invoices.

Order: database -> migrations -> admin key -> ``gpumeter serve`` -> demo provider (console
API) -> last month backfilled by the simulator -> last month's invoices finalized -> two
``gpumeter-agent`` processes with simulated GPUs, one scripted to fail (XID 79) -> the service
opens a failover to the spare and sends ``failover.requested`` as a signed webhook -> the demo's
orchestrator (``app.demo.orchestrator``) answers it ``--restart-after`` s later, the job resumed ->
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
from app.core.console_client import Api
from app.core.db import get_engine, transaction
from app.core.epoch import epoch
from app.core.local_service import NotReady, port_in_use, wait_until_ready
from app.core.logging import configure_logging
from app.demo.orchestrator import NO_SPARE, REQUESTED, Orchestrator
from app.demo.processes import Child, Processes
from app.demo.provider import create_provider, pool_idle_gpus
from app.demo.summary import PeriodSummary, summarise
from app.settings import get_settings
from app.simulate.history import SimGpu
from app.simulate.progress import Progress
from app.simulate.run import Options, simulate
from metering_agent.nvml.simulated import DEFAULT_MODEL

BACKFILL_FAILURE_RATE = 0.03  # per GPU-day: enough that a small fleet shows failures
READY_TIMEOUT_S = 90

OpenDatabase = Callable[[Path], AbstractContextManager[str]]


@dataclass(frozen=True)
class DemoOptions:
    data_dir: Path | None
    duration: float | None
    port: int
    seed: int = 7
    fail_after_s: float = 20  # the scripted XID 79, seconds after the agents start
    restart_s: float = 20  # the orchestrator's job restart on the spare: the credited window
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
        stack.callback(demo.close)
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


def second_of(moment: str) -> int:
    return epoch(datetime.fromisoformat(moment))


def failover_line(failover: dict[str, Any]) -> str:
    """What the service did about a failure: detected after N s, which spare (or none)."""
    failed, detected = (datetime.fromisoformat(failover[k]) for k in ("failed_at", "detected_at"))
    after = (detected - failed).total_seconds()  # from the first failed second
    head = f"GPU {failover['failed_gpu_uuid']} failed: detected after {after:.1f} s"
    spare = failover.get("spare_gpu_uuid")
    if spare is None:
        return f"{head}, no spare free ({failover.get('reason') or 'none'}): credited as failure"
    return f"{head}, spare {spare} chosen"


def month_start(moment: datetime, back: int = 0) -> datetime:
    month = moment.year * 12 + moment.month - 1 - back
    return datetime(month // 12, month % 12 + 1, 1, tzinfo=UTC)


# The demo's invoices are complete documents: a (fictional) seller with a postal address and a
# tax id, unless the environment names one (GPUMETER_SELLER_*, docs/configuration.md).
DEMO_SELLER = {
    "GPUMETER_SELLER_NAME": "Example GPU Cloud GmbH",
    "GPUMETER_SELLER_ADDRESS": "Hauptstr. 1\n10115 Berlin\nGermany",
    "GPUMETER_SELLER_TAX_ID": "DE123456789",
}


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
        self.env = {
            **DEMO_SELLER,
            **os.environ,
            "GPUMETER_DATABASE_URL": url,
            "GPUMETER_SECRET_KEY": secret,
            "GPUMETER_WEBHOOK_ALLOW_PRIVATE": "true",  # the orchestrator listens on 127.0.0.1
            "GPUMETER_PUBLIC_URL": self.base,  # the portal link it prints is absolute
            # The demo finalizes last month itself, after backfilling it. The service's
            # scheduled run may tick during the backfill (last month's grace is over): it only
            # drafts, and the demo's run re-drafts from the backfilled telemetry and finalizes.
            "GPUMETER_INVOICE_SCHEDULE_FINALIZE": "false",
        }
        self.started = datetime.now(UTC)
        self.api: Api | None = None
        self.orchestrator: Orchestrator | None = None
        self.agents: list[Child] = []
        self.target = ""  # the GPU the fault script fails
        self.failover: dict[str, Any] | None = None  # the live failure's requested failover
        self.resumed_at: int | None = None

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
        with step("starting the orchestrator (receives the failover webhooks)"):
            self.orchestrator = Orchestrator(self.api, self.options.restart_s)
            self.orchestrator.start()
            self.orchestrator.register()
        tag = datetime.now(UTC).strftime("%H%M%S")
        last_month = month_start(self.started, 1)
        with step("creating the demo provider through the API (plan, customers, nodes)"):
            self.provider = create_provider(self.api, tag, last_month)
        with step(f"backfilling history since {last_month:%Y-%m-%d} with the simulator"):
            self._backfill(last_month)
        with step("putting the GPUs no rental holds into the hot-spare pool"):
            spares = pool_idle_gpus(self.api, self.provider)
        self.progress.say(f"  {len(spares)} hot spares: {', '.join(spares)}")
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
            json.dumps([{"at": self.options.fail_after_s, "gpu": index, "fault": "xid", "xid": 79}])
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
        options = self.options
        stop = f"stops after {options.duration:g} s" if options.duration else "runs until Ctrl-C"
        self.progress.say(
            "\n"
            "gpumeter demo is running\n"
            f"  dashboard link (Acme AI): {link}\n"
            f"  admin key:                {self.admin_key}\n"
            f"  API docs:                 {self.base}/docs\n"
            f"  processes:                {pids} (in {self.directory / 'state.json'})\n"
            f"  in ~{options.fail_after_s:g} s GPU {self.target} fails (XID 79); the service "
            f"requests a failover to a spare, the orchestrator resumes the job there "
            f"{options.restart_s:g} s later\n"
            f"  the demo {stop}\n"
        )

    # --- live -----------------------------------------------------------------------------

    def live(self, duration: float | None) -> None:
        deadline = None if duration is None else time.monotonic() + duration
        while deadline is None or time.monotonic() < deadline:
            self._check_children()
            self._report_failover()
            time.sleep(1)

    def _check_children(self) -> None:
        for child in self.processes.children:
            if child.process.poll() is not None:
                raise RuntimeError(f"{child.name} exited early; see {child.log_path}")

    def _report_failover(self) -> None:
        """Say what the service and the orchestrator did about the live failure, once each:
        the failover requested (or no spare), then the job resumed on the spare."""
        assert self.orchestrator is not None
        if self.failover is None:
            self.failover = self._failover_event(self.orchestrator)
            if self.failover is not None:
                self.progress.say(failover_line(self.failover))
            return
        resume = self.orchestrator.resumed().get(str(self.failover["failover_id"]))
        if resume is not None and self.resumed_at is None:
            self.resumed_at = resume.resumed_at
            self.progress.say(
                f"Acme AI's rental resumed on GPU {self.failover['spare_gpu_uuid']} after "
                f"{self._resumed_after()} s (failure to resumption); those seconds are credited"
            )

    def _resumed_after(self) -> int | None:
        if self.failover is None or self.resumed_at is None:
            return None
        return self.resumed_at - second_of(self.failover["failed_at"])

    def _failover_event(self, orchestrator: Orchestrator) -> dict[str, Any] | None:
        for event_type in (REQUESTED, NO_SPARE):
            for arrival in orchestrator.events(event_type):
                if arrival.data["failed_gpu_uuid"] == self.target:
                    return arrival.data
        return None

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
        seconds = sum(s.credited_seconds_on(self.target, self.agents_started) for s in summaries)
        lines = ["", "summary"] + [f"  {s.line()}" for s in summaries]
        lines.append(f"  live failure credit (GPU {self.target}): USD {live:.2f}")
        lines.append(f"  live failure: {self._live_story()}, credited {seconds} s (USD {live:.2f})")
        lines.append(f"  backfill: {self.backfill.failures} simulated failures, "
                     f"{self.backfill.migrations} migrations to spares")  # fmt: skip
        self.progress.say("\n".join(lines) + "\n")

    def _live_story(self) -> str:
        if self.failover is None:
            return "no failover was requested"
        story = failover_line(self.failover)
        after = self._resumed_after()
        return story + ("" if after is None else f", resumed after {after} s")

    # --- API --------------------------------------------------------------------------------

    def api_get(self, path: str, **params: Any) -> Any:
        assert self.api is not None
        return self.api.get(path, **params)

    def api_post(self, path: str, body: dict[str, Any]) -> Any:
        assert self.api is not None
        return self.api.post(path, body)

    def close(self) -> None:
        if self.orchestrator is not None:
            self.orchestrator.stop()
        if self.api is not None:
            self.api.close()
