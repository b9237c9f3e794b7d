"""Cut records (every upload round, #15) store exactly what uncut records store.

The same per-second readings go through the agent's own record builder twice: once cut only at
state changes and minute boundaries (the old agent), once also at arbitrary extra points (upload
rounds, health events), uploaded in arbitrary batches with re-sends. Through the real ingest API
and Postgres, both GPUs' segments (with their evidence) and minute metrics, read back through the
API, must be identical: a cut never double-counts or loses a second, or a joule.
"""

from __future__ import annotations

import gzip
import itertools
import json
import time
from dataclasses import asdict
from typing import Any

from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metering_agent.classifier import event_id
from metering_agent.nvml.provider import GpuReading
from metering_agent.protocol import EventKind, GpuState, HealthEvent, UsageRecord
from metering_agent.records import RecordBuilder
from tests.harness import Console, bearer

HOUR = 3600
STATES = [GpuState.HEALTHY, GpuState.DEGRADED, GpuState.FAILED]
_gpus = itertools.count()


@st.composite
def seconds_and_cuts(draw: st.DrawFn) -> dict[str, Any]:
    length = draw(st.integers(2, 150))
    runs = draw(st.lists(st.tuples(st.sampled_from(STATES), st.integers(1, 40)), min_size=1))
    states = list(itertools.chain.from_iterable([s] * n for s, n in runs))
    states = (states * (length // len(states) + 1))[:length]
    per_second = st.tuples(
        st.integers(0, 100), st.integers(0, 100), st.integers(50_000, 700_000),
        st.integers(0, 900_000), st.integers(30, 90),
    )  # fmt: skip
    return {
        "offset": draw(st.integers(0, HOUR - 1)),  # where in the hour it starts (may cross it)
        "states": states,
        "readings": draw(st.lists(per_second, min_size=length, max_size=length)),
        "cuts": draw(st.sets(st.integers(1, length - 1))),  # cut after this many seconds
        "batch_cuts": draw(st.sets(st.integers(1, 400), max_size=8)),
        "resend": draw(st.booleans()),
    }


def build(gpu: str, start: int, case: dict[str, Any], *, cut: bool) -> list[UsageRecord]:
    """The agent's records of these seconds, also cut at ``case["cuts"]`` when ``cut``."""
    builder, records, energy_mj = RecordBuilder(gpu, "H100"), [], 10**9
    for i, (state, (util, mem, power, joules, temp)) in enumerate(
        zip(case["states"], case["readings"], strict=True)
    ):
        energy_mj += joules
        reading = GpuReading(
            0, gpu, "H100", gpu_util=util, mem_util=mem, mem_used_mib=1000 + util,
            mem_total_mib=81_559, power_mw=power, energy_mj=energy_mj, temp_c=temp,
            sm_clock_mhz=1980,
        )  # fmt: skip
        if cut and i in case["cuts"]:
            records += builder.close()
        records += builder.add(start + i, reading, state)
    return records + builder.close()


def state_changes(gpu: str, start: int, states: list[GpuState]) -> list[HealthEvent]:
    starts = [i for i in range(len(states)) if i == 0 or states[i] != states[i - 1]]
    return [
        HealthEvent(
            event_id(gpu, start + i, EventKind.STATE_CHANGE.value, states[i].value, 0),
            gpu,
            start + i,
            EventKind.STATE_CHANGE,
            state=states[i],
            rule=f"rule_{states[i]}",
        )
        for i in starts
    ]


def post(
    client: TestClient, token: str, records: list[UsageRecord], events: list[HealthEvent],
    case: dict[str, Any], *, compress: bool,
) -> None:  # fmt: skip
    """Upload in batches split at ``batch_cuts``; the events ride with the first one."""
    bounds = sorted({0, len(records)} | {c for c in case["batch_cuts"] if c < len(records)})
    batches = [
        {"batch_id": f"{records[0].gpu_uuid}-{a}", "records": [asdict(r) for r in records[a:b]],
         "events": [asdict(e) for e in events] if a == 0 else []}
        for a, b in itertools.pairwise(bounds)
    ]  # fmt: skip
    if case["resend"]:
        batches.append(batches[0])  # a reply lost: the same batch again
    for batch in batches:
        body = json.dumps(batch).encode()
        headers = {**bearer(token), "Content-Type": "application/json"}
        if compress:
            body, headers = gzip.compress(body), {**headers, "Content-Encoding": "gzip"}
        response = client.post("/v1/ingest", content=body, headers=headers)
        assert response.status_code == 200, response.text


def stored(client: TestClient, console: Console, gpu: str, lo: int, hi: int) -> Any:
    window = f"start={lo}&end={hi}"
    timeline = client.get(f"/v1/gpus/{gpu}/timeline?{window}", headers=console.headers).json()
    metrics = client.get(f"/v1/gpus/{gpu}/metrics?{window}", headers=console.headers).json()
    segments = [
        (s["start_s"], s["end_s"], s["state"], s["evidence"] and s["evidence"]["rule"])
        for s in timeline["segments"]
    ]
    return segments, timeline["unmetered"], metrics["points"]


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=seconds_and_cuts())
def test_cut_records_store_exactly_what_uncut_records_store(
    client: TestClient, console: Console, case: dict[str, Any]
) -> None:
    n = next(_gpus)
    token = console.node(f"node-{n}")["token"]["key"]
    start = (int(time.time()) // HOUR - 2) * HOUR + case["offset"]
    end = start + len(case["states"])
    views = []
    for gpu, cut in ((f"GPU-whole-{n}", False), (f"GPU-cut-{n}", True)):
        records = build(gpu, start, case, cut=cut)
        post(client, token, records, state_changes(gpu, start, case["states"]), case, compress=cut)
        views.append(stored(client, console, gpu, start - 60, end + 60))
    whole, cut_view = views
    assert cut_view == whole
    segments, unmetered, points = whole
    assert sum(b - a for a, b, _, _ in segments) == end - start, "every second once"
    assert sum(p["observed_s"] for p in points) == end - start
    assert [(g["start_s"], g["end_s"]) for g in unmetered] == [(start - 60, start), (end, end + 60)]


def test_a_cut_minute_carries_its_energy_to_the_decijoule() -> None:
    """Rounding per record would lose up to 0.05 J per cut; the running total carries it."""
    case = {"states": [GpuState.HEALTHY] * 6, "cuts": {1, 2, 3, 4, 5}}
    case["readings"] = [(50, 50, 300_000, 104_040, 60)] * 6  # 104.04 J a second
    start = 1_700_000_040
    whole = build("GPU-a", start, case, cut=False)
    pieces = build("GPU-a", start, case, cut=True)
    assert [r.energy_j for r in whole] == [820.2]  # 300 J (no previous counter) + 5 x 104.04
    assert [r.energy_j for r in pieces] == [300.0, 104.0, 104.1, 104.0, 104.1, 104.0]
    assert round(sum(r.energy_j or 0 for r in pieces) * 10) == 8202
