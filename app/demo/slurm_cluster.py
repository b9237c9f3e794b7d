"""A throwaway Slurm cluster on this host: one slurmctld and one ``slurmd -N`` per node, each
on a free port, with a config of its own under ``directory`` (tests, the Slurm benchmark).

Every node has ``gpus`` GPUs as GRES, backed by plain files (without ``File=`` a node
registers with no GPUs and goes INVAL). Every node is in the default ``gpu`` partition; the
spares are held by the ``gpumeter_spares`` reservation (users root), as a provider holds them
and as the adapter keeps it, so no customer job lands on them. No
munge (``auth/none``), no accounting database: ``squeue --json --states=all`` keeps ended jobs
for ``MinJobAge``. Every daemon runs in the foreground (``-D``) as our child and is stopped by
its PID; ``stop`` cancels the jobs first, so no job step outlives the cluster.

With ``accounts`` given, the cluster is shaped as a provider runs it: slurmdbd on a MariaDB of
its own (``mariadb-install-db`` into ``directory``, ``mariadbd`` on a free port),
``AccountingStorageEnforce=associations,limits`` (a job naming an account root is not
associated with is refused at submission), those accounts, a ``normal`` QOS and an ``urgent``
one that preempts it (``PreemptMode=REQUEUE``), and ``sacct`` keeping every run.

The slurmd spool directories, where each job step opens a Unix socket, live in a short
directory of their own under /tmp, not under ``directory``: a socket's path may have at most
108 bytes, and a test's directory under a CI run's TMPDIR is longer ("Unix socket path ... is
too long (117 > 108)": the job's step never starts).
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from app.core.local_service import free_port
from app.core.processes import stop_child

CLUSTER_NAME = "gpumeter"
WORKER_PARTITION = "gpu"
SPARE_RESERVATION = "gpumeter_spares"
START_TIMEOUT_S = 30.0
JOBS_GONE_TIMEOUT_S = 30.0
HEALTH_CHECK_INTERVAL_S = 2


URGENT_QOS = "urgent"  # preempts the default QOS's jobs, which are requeued
# slurmd logs the GPU device files it loaded, in GRES index order (``device_order``).
GRES_DEBUG = "DebugFlags=Gres\nSlurmdDebug=debug"
ACCOUNTING_COMMANDS = ("slurmdbd", "sacctmgr", "sacct", "mariadbd", "mariadb-install-db")


class SlurmNotInstalled(RuntimeError):
    pass


def installed(*, accounting: bool = False) -> bool:
    commands = ("slurmctld", "slurmd", "scontrol", "squeue")
    return all(shutil.which(name) for name in commands + (ACCOUNTING_COMMANDS * accounting))


@dataclass
class LocalSlurm:
    directory: Path
    workers: list[str]
    spares: list[str]
    gpus: int = 2
    accounts: list[str] = field(default_factory=list)  # with slurmdbd and MariaDB if any
    min_job_age_s: int = 3600
    # slurmd's HealthCheckProgram (run every HEALTH_CHECK_INTERVAL_S on every node), if any.
    health_check: Path | None = None
    # Per node, its GPUs' device file numbers in gres.conf's File= order (default 0, 1, ...):
    # a node whose Slurm numbers GPUs in another order than NVML (app.slurm.identity).
    gres_order: dict[str, list[int]] = field(default_factory=dict)
    controller: subprocess.Popen[bytes] | None = None
    daemons: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    spool: Path | None = None  # the slurmd spools' short directory, while the cluster runs
    db_port: int = 0
    dbd_port: int = 0

    @property
    def nodes(self) -> list[str]:
        return [*self.workers, *self.spares]

    @property
    def conf(self) -> Path:
        return self.directory / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    # --- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        if not installed(accounting=bool(self.accounts)):
            raise SlurmNotInstalled(
                "Slurm is not installed: apt-get install slurm-wlm"
                + (" slurmdbd mariadb-server" if self.accounts else "")
            )
        self._write_config()
        if self.accounts:
            self._start_accounting()
        self.start_controller()
        for node in self.nodes:
            self.daemons[f"slurmd-{node}"] = self._daemon(
                f"slurmd-{node}", ["slurmd", "-f", str(self.conf), "-N", node, "-D"]
            )
        self.wait_for(lambda: self.idle_nodes() >= set(self.nodes), "every node idle")
        if self.spares:
            self.run(
                "scontrol", "create", "reservation", f"ReservationName={SPARE_RESERVATION}",
                f"Nodes={','.join(self.spares)}", "StartTime=now", "Duration=infinite",
                "Users=root", "Flags=IGNORE_JOBS",
            )  # fmt: skip

    def start_controller(self) -> None:
        """Start slurmctld (again, after ``stop_controller``: it reloads its saved state)."""
        self.controller = self._daemon("slurmctld", ["slurmctld", "-f", str(self.conf), "-D", "-i"])
        self.wait_for(self.controller_answers, "slurmctld answering")

    def stop_controller(self) -> None:
        if self.controller is not None:
            stop_child(self.controller, "slurmctld")
            self.controller = None

    def stop(self) -> None:
        """Cancel every job and wait for their steps to end, then stop the daemons by PID."""
        try:
            if self.controller is not None and self.controller.poll() is None:
                self.scontrol_ok("scancel", "--full", "--user=root")
                self.wait_for(lambda: not self.squeue_ids(), "every job gone", JOBS_GONE_TIMEOUT_S)
        finally:
            for name, daemon in self.daemons.items():
                if name.startswith("slurmd-"):
                    stop_child(daemon, name)
            self.stop_controller()
            for name in ("slurmdbd", "mariadbd"):  # the database last: slurmdbd flushes to it
                if name in self.daemons:
                    stop_child(self.daemons[name], name)
            self.daemons.clear()
            if self.spool is not None:
                shutil.rmtree(self.spool, ignore_errors=True)
                self.spool = None

    # --- what tests look at -----------------------------------------------------------------

    def run(self, *command: str) -> str:
        done = subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=15)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)}: {done.stderr.strip() or done.stdout}")
        return done.stdout

    def scontrol_ok(self, *command: str) -> bool:
        try:
            self.run(*command)
        except (RuntimeError, subprocess.TimeoutExpired):
            return False
        return True

    def controller_answers(self) -> bool:
        return self.scontrol_ok("scontrol", "ping")

    def submit(
        self, account: str, nodes: int, *, gpus: int | None = None, extra: tuple[str, ...] = ()
    ) -> int:
        """A requeueable batch job holding ``gpus`` GPUs on each of ``nodes`` nodes (``extra``:
        more sbatch options)."""
        out = self.run(
            "sbatch", "--parsable", f"--nodes={nodes}", f"--gres=gpu:{gpus or self.gpus}",
            f"--account={account}", "--requeue", "--output=/dev/null",
            f"--chdir={self.directory}", *extra, "--wrap", "sleep 100000",
        )  # fmt: skip
        return int(out.strip().split(";")[0])

    def squeue_ids(self) -> list[str]:
        return self.run("squeue", "-h", "-o", "%i").split()

    def idle_nodes(self) -> set[str]:
        """Nodes free for a job (idle, or idle and reserved)."""
        out = self.run("sinfo", "-h", "-N", "-o", "%N %t")
        return {n for n, state in map(str.split, out.splitlines()) if state in ("idle", "resv")}

    def reserved_nodes(self) -> list[str]:
        """The nodes the spare reservation holds."""
        shown = self.run("scontrol", "show", "reservation", "--oneliner")
        found = re.search(rf"ReservationName={SPARE_RESERVATION} .*?\bNodes=(\S+)", shown)
        if found is None or found.group(1) == "(null)":
            return []
        return sorted(self.run("scontrol", "show", "hostnames", found.group(1)).split())

    def node_state(self, node: str) -> str:
        """The node's state as scontrol shows it, e.g. "IDLE", "IDLE+DRAIN", "MIXED"."""
        shown = self.run("scontrol", "show", "node", node, "--oneliner")
        found = re.search(r"\bState=(\S+)", shown)
        return "" if found is None else found.group(1)

    def node_reason(self, node: str) -> str:
        """Why the node is drained or down ("" when it is neither)."""
        return self.run("sinfo", "-h", "-R", "-n", node, "-o", "%E").strip()

    def partition_nodes(self, partition: str) -> list[str]:
        out = self.run("sinfo", "-h", "-N", "-p", partition, "-o", "%N")
        return sorted(set(out.split()))

    def wait_for(self, ready, what: str, timeout_s: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"Slurm: {what} not within {timeout_s:g} s (logs: {self.directory})"
                )
            time.sleep(0.2)

    # --- accounting: MariaDB and slurmdbd ----------------------------------------------------

    def _start_accounting(self) -> None:
        """MariaDB in ``directory``, slurmdbd on it, then the cluster, accounts and QOS."""
        assert self.spool is not None
        data, socket = self.directory / "mysql", self.spool / "mysql.sock"
        self.run(
            "mariadb-install-db", "--no-defaults", f"--datadir={data}", "--user=root",
            "--auth-root-authentication-method=normal", "--skip-test-db",
        )  # fmt: skip
        self.daemons["mariadbd"] = self._daemon(
            "mariadbd",
            ["mariadbd", "--no-defaults", f"--datadir={data}", f"--socket={socket}",
             f"--port={self.db_port}", "--bind-address=127.0.0.1", "--user=root",
             "--skip-name-resolve", "--skip-log-bin", "--innodb-buffer-pool-size=32M",
             f"--pid-file={self.directory / 'mariadbd.pid'}"],
        )  # fmt: skip
        sql = "CREATE USER 'slurm'@'127.0.0.1'; GRANT ALL ON *.* TO 'slurm'@'127.0.0.1';"
        client = ("mariadb", "--no-defaults", f"--socket={socket}", "-uroot")
        self.wait_for(lambda: self.scontrol_ok(*client, "-e", "SELECT 1"), "MariaDB answering")
        self.run(*client, "-e", sql)
        self.daemons["slurmdbd"] = self._daemon("slurmdbd", ["slurmdbd", "-D"])
        self.wait_for(lambda: self.scontrol_ok("sacctmgr", "-n", "list", "cluster"), "slurmdbd")
        every = ",".join(self.accounts)
        for command in (
            ("add", "cluster", CLUSTER_NAME),
            ("add", "account", every, f"Cluster={CLUSTER_NAME}"),
            ("add", "qos", URGENT_QOS, "Priority=1000", "Preempt=normal", "PreemptMode=requeue"),
            ("add", "user", "root", f"Account={every}", f"DefaultAccount={self.accounts[0]}"),
            ("modify", "user", "root", "set", f"QOS=normal,{URGENT_QOS}"),
        ):
            self.run("sacctmgr", "-i", *command)

    def _accounting_config(self) -> str:
        if not self.accounts:
            return "AccountingStorageType=accounting_storage/none\nJobCompType=jobcomp/none"
        dbd = self.directory / "slurmdbd.conf"
        dbd.write_text(f"""\
AuthType=auth/none
DbdHost=localhost
DbdPort={self.dbd_port}
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={self.db_port}
StorageUser=slurm
StorageLoc=slurm_acct_db
PidFile={self.directory}/slurmdbd.pid
LogFile={self.directory}/slurmdbd.log
""")
        dbd.chmod(0o600)  # slurmdbd refuses a config others may read
        return f"""\
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort={self.dbd_port}
AccountingStorageEnforce=associations,limits
AccountingStorageTRES=gres/gpu
PriorityType=priority/multifactor
PreemptType=preempt/qos
PreemptMode=REQUEUE"""

    def reboots(self) -> int:
        """How often a slurmd was asked to reboot its node (``scontrol reboot``)."""
        marks = self.directory / "reboots"
        return len(marks.read_text().splitlines()) if marks.exists() else 0

    def rebooted(self) -> list[str]:
        """Each node whose simulated reboot completed, with the reason it carried then
        ("n1 gpumeter: ... : reboot issued"), in order."""
        done = self.directory / "rebooted"
        return done.read_text().splitlines() if done.exists() else []

    # --- set-up -----------------------------------------------------------------------------

    def _health_check_config(self) -> str:
        if self.health_check is None:
            return ""
        return (
            f"HealthCheckProgram={self.health_check}\n"
            f"HealthCheckInterval={HEALTH_CHECK_INTERVAL_S}\nHealthCheckNodeState=ANY"
        )

    def _reboot_program(self) -> Path:
        """``slurmd -N`` nodes share this host, which no test may reboot: the program records
        that it ran, and a second later completes the reboot as a rebooted node's slurmd would
        (``nextstate=RESUME``): every node whose reboot Slurm issued is resumed, its name and
        reason recorded first. slurmd runs the program without naming its node; the issued
        state says which. (Without this, slurmctld waits ``ResumeTimeout`` and marks it DOWN.)"""
        program, marks, done = (self.directory / n for n in ("reboot", "reboots", "rebooted"))
        scontrol = f"SLURM_CONF={self.conf} {shutil.which('scontrol') or 'scontrol'}"
        program.write_text(
            "#!/bin/sh\n"
            f"echo reboot >> {marks}\n"
            "(sleep 1\n"
            f" {scontrol} show node --oneliner | grep 'State=[^ ]*REBOOT_ISSUED' |\n"
            " sed -n 's/^NodeName=\\([^ ]*\\) .* Reason=\\(.*\\) \\[.*$/\\1 \\2/p' |\n"
            f' while read -r node reason; do echo "$node $reason" >> {done};\n'
            f'  {scontrol} update nodename="$node" state=resume; done\n'
            ") >/dev/null 2>&1 &\n"
        )
        program.chmod(0o755)
        return program

    def _daemon(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        with (self.directory / f"{name}.out").open("ab") as out:
            return subprocess.Popen(argv, env=self.env, stdout=out, stderr=subprocess.STDOUT)

    def _write_config(self) -> None:
        d = self.directory
        for sub in ("state", "dev"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        short = "/tmp" if Path("/tmp").is_dir() else None  # TMPDIR may be long (see above)
        self.spool = Path(tempfile.mkdtemp(prefix="slurmd-", dir=short))
        for number in {n for order in self.gres_order.values() for n in order} | set(
            range(self.gpus)
        ):
            _device_file(d / "dev" / f"gpu{number}", character=bool(self.gres_order))
        nodes = "\n".join(
            f"NodeName={node} NodeHostname=localhost Port={free_port()} CPUs=2 RealMemory=1000 "
            f"Gres=gpu:{self.gpus} State=UNKNOWN"
            for node in self.nodes
        )
        self.db_port, self.dbd_port = free_port(), free_port()
        accounting = self._accounting_config()
        self.conf.write_text(f"""\
ClusterName={CLUSTER_NAME}
SlurmctldHost=localhost
SlurmctldPort={free_port()}
AuthType=auth/none
CredType=cred/none
SlurmUser=root
SlurmdUser=root
StateSaveLocation={d}/state
SlurmdSpoolDir={self.spool}/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
MinJobAge={self.min_job_age_s}
RebootProgram={self._reboot_program()}
{self._health_check_config()}
JobRequeue=1
KillWait=2
{accounting}
JobAcctGatherType=jobacct_gather/none
{GRES_DEBUG if self.gres_order else ""}
{nodes}
PartitionName={WORKER_PARTITION} Nodes={",".join(self.nodes)} Default=YES State=UP
""")
        (d / "gres.conf").write_text(
            "\n".join(
                f"NodeName={node} Name=gpu File={d}/dev/gpu[{','.join(map(str, order))}]"
                for node in self.nodes
                if (order := self.gres_order.get(node, list(range(self.gpus))))
            )
            + "\n"
        )

    @property
    def character_devices(self) -> bool:
        """Whether the GPUs' device files are character devices (slurmd loads and logs them)."""
        return stat.S_ISCHR((self.directory / "dev" / "gpu0").stat().st_mode)

    def device_order(self, node: str) -> list[int]:
        """The node's GPU device numbers in GRES index order, as its slurmd says it loaded
        them (``DebugFlags=Gres``, with a permuted ``gres_order``; slurmd logs only character
        devices: empty where this host could not make them, see ``character_devices``)."""
        log = self.directory / f"slurmd-{node}.log"
        text = log.read_text() if log.exists() else ""
        loaded = [int(n) for n in re.findall(r"gpu device number (\d+)\(", text)]
        return loaded[-len(self.gres_order.get(node, range(self.gpus))) :]


def _device_file(path: Path, *, character: bool) -> None:
    """A GPU's device file: a character device where this host lets us make one (as
    /dev/null's: slurmd then loads it and logs it in GRES index order), else a plain file
    (enough for slurmd to count the GPU)."""
    if character and not path.exists():
        try:
            os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 3))
            return
        except PermissionError:
            pass
    path.touch()
