"""Write simulated telemetry with ingest's own writers.

Segments, health events, evidence links, the GPUs' last state and the open hour go through
metering's repository writers (``app.metering.service`` offers them) exactly as ingest calls
them. Closed GPU-hours, the bulk of a month
(~1.2 KB each, millions of rows), are streamed with binary COPY into the closed-hours table the
repository writes them to, in key order, while the next rows are being built.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from itertools import islice

from sqlalchemy.orm import Session

from app.fleet.service import record_latest
from app.metering import service as metering
from app.metering.idle import util_floor_tenths
from app.metering.segments import Span
from app.simulate.history import SimGpu
from app.simulate.progress import Counter
from app.simulate.telemetry import HOUR, VARIANTS, cut_hour, steady_hour
from metering_agent.nvml.simulated import model_for
from metering_agent.protocol import HealthEvent

CHUNK = 20_000
DEFAULT_IDLE_SHARE = 1 / 12  # a rented GPU-hour is idle (job done, waiting for data) 1 in 12
COPY_CLOSED = (
    "COPY gpu_minute_metrics (gpu_uuid, hour, mem_total_mib, slots, util_min_tenths)"
    " FROM STDIN (FORMAT BINARY)"
)

Row = tuple[str, int, int | None, bytes]


def _chunks(items: list, size: int = CHUNK) -> Iterator[list]:
    it = iter(items)
    while chunk := list(islice(it, size)):
        yield chunk


def write_history(session: Session, runs: dict[str, list[Span]], events: list[HealthEvent]) -> None:
    """Segments, events and their evidence links, and each GPU's last state."""
    for chunk in _chunks(events):
        metering.insert_events(session, chunk)
    upserts = [(gpu, span) for gpu, spans in runs.items() for span in spans]
    for chunk in _chunks(upserts):
        metering.write_segments(session, chunk, [])
    starts = sorted((gpu, span.start) for gpu, span in upserts)
    for chunk in _chunks(starts):
        metering.attach_evidence(session, chunk)


def touch(session: Session, gpus: list[SimGpu], runs: dict[str, list[Span]], end: int) -> None:
    latest = {
        g.uuid: (g.model, runs[g.uuid][-1].state, end, None, None) for g in gpus if runs[g.uuid]
    }
    for chunk in _chunks(list(latest)):
        record_latest(session, {gpu: latest[gpu] for gpu in chunk})


def hour_rows(
    gpu: SimGpu,
    runs: list[Span],
    rented: list[tuple[int, int]],
    rng: random.Random,
    idle_share: float = DEFAULT_IDLE_SHARE,
    idle_below_tenths: int | None = None,
) -> Iterator[Row]:
    """Every GPU-hour row of ``runs`` (time order): steady hours shared, cut hours packed.

    A rented hour is idle with probability ``idle_share``. With ``idle_below_tenths`` only the
    rows idle time is measured from are made: rented hours holding a minute below that
    utilisation, which is what ``idle_minutes`` selects by the stored utilisation floor.
    """
    start, end = runs[0].start, runs[-1].end
    mem_total = model_for(gpu.model).mem_total_mib
    i = 0
    for hour in range(start - start % HOUR, end, HOUR):
        while runs[i].end <= hour:
            i += 1
        idle, variant = rng.random() < idle_share, rng.randrange(VARIANTS)
        busy = not idle and any(a <= hour < b for a, b in rented)
        run = runs[i]
        if run.start <= hour and run.end >= hour + HOUR:
            slots = steady_hour(gpu.model, run.state, busy, variant)
        else:
            inside = [r for r in runs[i:] if r.start < hour + HOUR]
            slots = cut_hour(gpu.uuid, gpu.model, hour, inside, busy, rng)
        if idle_below_tenths is None or _idle_and_rented(slots, hour, rented, idle_below_tenths):
            yield gpu.uuid, hour, mem_total, slots


def _idle_and_rented(
    slots: bytes, hour: int, rented: list[tuple[int, int]], threshold_tenths: int
) -> bool:
    floor = util_floor_tenths(slots)
    if floor is None or floor >= threshold_tenths:
        return False
    return any(a < hour + HOUR and b > hour for a, b in rented)


def write_metrics(session: Session, rows: Iterator[Row], counter: Counter) -> int:
    """Closed hours by COPY; each GPU's newest hour into the open table, as ingest leaves it."""
    raw = session.connection().connection.driver_connection
    assert raw is not None, "a checked-out connection has its psycopg connection"
    newest: dict[tuple[str, int], tuple[bytes, int | None]] = {}
    written = 0
    with raw.cursor() as cursor, cursor.copy(COPY_CLOSED) as copy:
        copy.set_types(["text", "int8", "int4", "bytea", "int2"])
        pending: Row | None = None
        for row in rows:
            if pending is not None and pending[0] == row[0]:
                copy.write_row((*pending, util_floor_tenths(pending[3])))
                written += 1
            elif pending is not None:
                newest[(pending[0], pending[1])] = (pending[3], pending[2])
                counter.add()
            pending = row
        if pending is not None:
            newest[(pending[0], pending[1])] = (pending[3], pending[2])
            counter.add()
    for chunk in _chunks(list(newest)):
        metering.write_metric_rows(session, {k: newest[k] for k in chunk}, closed=False)
    return written + len(newest)
