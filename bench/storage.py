"""Storage benchmark: bytes per GPU-hour of agent-shaped telemetry, steady state, all included.

Two runs, each in its own database, through the real ingest code
(``app.metering.service.ingest``, one transaction per node's batch, as the endpoint runs it),
with readings from a random walk like the agent's simulator (utilisation, memory, power,
energy, temperature), over ``--hours`` hours ending at the current hour:

* cadence run: ``--agent-gpus`` GPUs uploading every ``--agent-upload-s`` seconds (2: as the
  agent does at its fastest; a record per GPU per upload round, cut also at each minute
  boundary): the rewrites of the open hour and of growing segments, and the dead versions
  they leave;
* volume run: ``--gpus`` GPUs, records cut at minute boundaries (an agent uploading once a
  minute): the same closed hours for 30 times fewer records, so enough GPU-hours in three
  minutes that a page more or less in any relation moves the figure by a few bytes only.

Every 5 simulated minutes the tables are VACUUMed, as autovacuum would (its naptime is a
minute; the open-hour table passes its threshold within seconds). The figure is the growth of
the tables that grow with time (segments, closed minute metrics, health events:
``pg_total_relation_size``: heap, indexes, TOAST, free and dead space, summed over
partitions) from the end of the warm-up hour to the end of the run, per GPU-hour ingested in
between. The open-hour table is a fixed working set per GPU, printed apart. GPUs sit on nodes
of 16, the service's default per-node cap (``max_gpus_per_node``): a bigger node is refused.
Closed hours are summarised as production does it, by the per-minute summaries job
(``app.metering.summaries``), here once every simulated minute.

The tests run a tiny configuration (``--hours 2 --gpus 16 --agent-gpus 1 --agent-upload-s
20``) so that a bench that stops running fails CI; its bytes are a page or two over few
GPU-hours, not a figure.

Prints progress on stderr and one final JSON line. Creates and drops its own databases on the
server of GPUMETER_DATABASE_URL (default postgresql://postgres@127.0.0.1/postgres).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import psycopg
from sqlalchemy import create_engine

import app.models  # noqa: F401 - every table registered, so foreign keys resolve
from app.core.db import transaction
from app.core.scratch_db import libpq_dsn, scratch_database, server_from_environment, table_bytes
from app.fleet.service import IngestGpus
from app.metering.service import ingest
from app.metering.summaries import summarise
from app.settings import Settings, sqlalchemy_url
from metering_agent.protocol import MINUTE, GpuState, IngestBatch, UsageRecord

HOUR = 3600
TABLES = ("gpu_state_segments", "gpu_minute_metrics", "gpu_minute_metrics_open", "health_events")
GROWING = ("gpu_state_segments", "gpu_minute_metrics", "health_events")
TARGET_BYTES_PER_GPU_HOUR = 1000
# Autovacuum wakes every minute and takes a table once 50 + 20 % of its rows are dead: the
# open-hour table (one row per GPU, rewritten every 2 s) crosses that within seconds.
VACUUM_EVERY_S = 300
NODE_GPUS = Settings.model_fields["max_gpus_per_node"].default  # the service's per-node cap
MODEL, MEM_TOTAL_MIB, IDLE_W, MAX_W = "NVIDIA H100 80GB HBM3", 81559, 70.0, 700.0


@dataclass
class SimulatedGpu:
    """A GPU's readings as a random walk (the agent's simulator's shape), two seconds a step."""

    uuid: str
    rng: random.Random
    util: float = 50.0

    def record(self, start: int, end: int) -> UsageRecord:
        seconds = end - start
        utils = []
        for _ in range(seconds):
            self.util = min(100.0, max(0.0, self.util + self.rng.gauss(0, 8)))
            utils.append(round(self.util))
        mean = sum(utils) / seconds
        power = [IDLE_W + (MAX_W - IDLE_W) * u / 100 for u in utils]
        return UsageRecord(
            gpu_uuid=self.uuid,
            model=MODEL,
            start=start,
            end=end,
            state=GpuState.HEALTHY,
            sample_count=seconds,
            gpu_util_mean=round(mean, 2),
            gpu_util_max=max(utils),
            mem_util_mean=round(mean * 0.6, 2),
            mem_used_max_mib=int(MEM_TOTAL_MIB * min(1.0, 0.05 + max(utils) / 110)),
            mem_total_mib=MEM_TOTAL_MIB,
            energy_j=round(sum(power), 3),
            power_max_w=round(max(power), 1),
            temp_max_c=round(32 + max(utils) * 0.45),
            sm_clock_mean_mhz=1980,
        )


def rounds(start: int, end: int, upload_s: int) -> Iterator[tuple[int, int]]:
    """The agent's record spans: cut at every upload round and at every minute boundary."""
    t = start
    while t < end:
        cut = min(t + upload_s, t - t % MINUTE + MINUTE, end)
        yield t, cut
        t = cut


def add_nodes(conninfo: str, nodes: int) -> list[uuid.UUID]:
    ids = [uuid.uuid4() for _ in range(nodes)]
    with psycopg.connect(conninfo) as conn:
        for node in ids:
            conn.execute(
                "INSERT INTO nodes (id, hostname, datacenter) VALUES (%s, %s, 'bench')",
                (node, f"storage-{node}"),
            )
    return ids


def vacuumed_bytes(conninfo: str, url: str) -> dict[str, int]:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        for table in TABLES:
            conn.execute(f"VACUUM {table}")
    return table_bytes(url, TABLES)


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass
class Phase:
    """One simulation: GPUs on nodes, hours, the upload interval; what it measured."""

    name: str
    gpus: int
    node_gpus: int
    hours: int
    upload_s: int
    records: int = 0
    seconds: float = 0.0
    growth: dict[str, int] = field(default_factory=dict)
    final: dict[str, int] = field(default_factory=dict)

    @property
    def gpu_hours(self) -> int:
        return self.gpus * (self.hours - 1)  # the first hour is the warm-up

    def per_gpu_hour(self, tables: Sequence[str] = TABLES) -> float:
        return sum(self.growth[t] for t in tables) / self.gpu_hours

    def figures(self) -> dict[str, object]:
        return {
            "gpus": self.gpus,
            "hours": self.hours,
            "upload_s": self.upload_s,
            "records": self.records,
            "ingest_seconds": round(self.seconds, 1),
            "growth_bytes": self.growth,
            "bytes_per_gpu_hour": round(self.per_gpu_hour(GROWING)),
            "bytes_per_gpu_hour_all_four_tables": round(self.per_gpu_hour()),
            "open_hour_bytes_per_gpu": round(self.final["gpu_minute_metrics_open"] / self.gpus),
        }


def simulate(phase: Phase, seed: int) -> None:
    """Ingest the phase's telemetry into a fresh database; record its tables' growth."""
    rng = random.Random(seed)
    gpus = [
        SimulatedGpu(f"GPU-{uuid.UUID(int=rng.getrandbits(128))}", random.Random(rng.random()))
        for _ in range(phase.gpus)
    ]
    for gpu in gpus:
        gpu.util = rng.uniform(0, 100)
    groups = [gpus[i : i + phase.node_gpus] for i in range(0, len(gpus), phase.node_gpus)]
    # The last simulated second lies in the past: ingest refuses records from the future.
    end = int(time.time()) // HOUR * HOUR
    start = end - phase.hours * HOUR
    settings = Settings()
    with scratch_database(server_from_environment(), "gpumeter_bench_storage") as url:
        conninfo = libpq_dsn(url)
        nodes = add_nodes(conninfo, len(groups))
        engine = create_engine(sqlalchemy_url(url))
        sizes: list[dict[str, int]] = []
        started = time.perf_counter()
        try:
            # The round at ``end`` closes the last hour (an hour closes when its GPU reports
            # the next); after each round that closes an hour, VACUUM and measure.
            for a, b in [*rounds(start, end, phase.upload_s), (end, end + 1)]:
                for node, group in zip(nodes, groups, strict=True):
                    batch = IngestBatch(uuid.uuid4().hex, [g.record(a, b) for g in group])
                    with transaction(engine) as session:
                        ingest(session, node, batch, settings, IngestGpus.of(settings))
                    phase.records += len(batch.records)
                if a % MINUTE == 0:  # the per-minute summaries job
                    with transaction(engine) as session:
                        summarise(session)
                if a % VACUUM_EVERY_S == 0:
                    bytes_now = vacuumed_bytes(conninfo, url)
                    if a % HOUR == 0 and a > start:
                        sizes.append(bytes_now)
                        total = sum(bytes_now.values())
                        say(f"{phase.name}: hour {len(sizes)}/{phase.hours}: {total:,} B")
        finally:
            engine.dispose()
        phase.seconds = time.perf_counter() - started
    phase.growth = {t: sizes[-1][t] - sizes[0][t] for t in TABLES}
    phase.final = sizes[-1]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=512, help="of the volume run")
    parser.add_argument("--hours", type=int, default=3, help="the first is the warm-up")
    parser.add_argument("--agent-gpus", type=int, default=16, help="of the cadence run")
    parser.add_argument("--agent-upload-s", type=int, default=2, help="of the cadence run")
    parser.add_argument("--seed", type=int, default=3)
    args = parser.parse_args(argv)
    phases = [
        Phase("agent cadence", args.agent_gpus, NODE_GPUS, args.hours, args.agent_upload_s),
        Phase("volume", args.gpus, NODE_GPUS, args.hours, upload_s=MINUTE),
    ]
    for phase in phases:
        simulate(phase, args.seed)
        say(f"{phase.name}: {phase.figures()}")
    cadence, volume = phases
    # Steady state: the growth of the tables that grow with time (segments, closed hours,
    # events) per GPU-hour; the open-hour table is a fixed working set per GPU, printed apart.
    # The volume run measures it to within a few bytes; the cadence run (2-s records, as the
    # agent uploads) shows what the rewrites leave once vacuumed, to within its resolution:
    # a page (8 KiB) more or less in one relation, over its fewer GPU-hours.
    per_gpu_hour = volume.per_gpu_hour(GROWING)
    result = {
        "cadence_run": cadence.figures(),
        "cadence_resolution_bytes_per_gpu_hour": round(8192 / cadence.gpu_hours),
        "volume_run": volume.figures(),
        "bytes_per_gpu_hour": round(per_gpu_hour),
        "bytes_per_gpu_hour_target": TARGET_BYTES_PER_GPU_HOUR,
        "met": per_gpu_hour <= TARGET_BYTES_PER_GPU_HOUR,
    }
    print(json.dumps(result))
    return 0 if result["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
