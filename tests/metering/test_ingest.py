"""POST /v1/ingest: validation, ownership, idempotency, conflicts, atomicity, aggregation."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import Engine, select, text

from app.core.db import transaction
from app.core.epoch import from_epoch
from app.fleet.models import Gpu
from app.metering.models import StateSegment
from app.settings import get_settings
from tests.harness import Console, bearer
from tests.metering.conftest import Agent, event, minute_ago, rec


def segments(db: Engine, gpu: str) -> list[tuple[int, int, str]]:
    with transaction(db) as session:
        rows = session.scalars(
            select(StateSegment).where(StateSegment.gpu_uuid == gpu).order_by(StateSegment.start)
        )
        return [(s.start, s.end, s.state) for s in rows]


def locs(body: dict[str, Any]) -> list[list[Any]]:
    return [item["loc"] for item in body["detail"]]


def test_first_report_registers_the_gpu_to_the_node(agent: Agent, db: Engine) -> None:
    t = minute_ago(3)
    result = agent.post([rec("GPU-1", t, t + 60)])
    assert result == {
        "batch_id": "b-1",
        "accepted": 1,
        "duplicates": 0,
        "events_accepted": 0,
        "events_duplicate": 0,
        "not_stored": [],
    }
    with transaction(db) as session:
        gpu = session.get_one(Gpu, "GPU-1")
        assert (str(gpu.node_id), gpu.model, gpu.pool.value) == (
            agent.node_id,
            "H100",
            "quarantine",
        )
        assert gpu.last_state == "healthy"


def test_a_gpu_on_its_nodes_word_alone_is_not_rentable_until_admitted(
    agent: Agent, console: Console
) -> None:
    t = minute_ago(3)
    agent.post([rec("GPU-1", t, t + 60)])
    rental = console.rental(console.customer()["id"], console.plan()["id"], start_at=_iso(t))
    refused = console.assign(rental["id"], "GPU-1", _iso(t), status=409)
    assert refused["detail"][0]["msg"] == (
        "GPU GPU-1 is in quarantine (its node reported it; no operator admitted it yet): "
        "admit it first, PATCH /v1/gpus/GPU-1 with pool rentable"
    )
    admitted = console.client.patch(
        "/v1/gpus/GPU-1", json={"pool": "rentable"}, headers=console.headers
    )
    assert admitted.json()["pool"] == "rentable"
    assert console.assign(rental["id"], "GPU-1", _iso(t))["gpu_uuid"] == "GPU-1"


def test_a_node_cannot_invent_more_gpus_than_its_cap(agent: Agent, db: Engine) -> None:
    t = minute_ago(3)
    agent.post([rec(f"GPU-{n}", t, t + 60) for n in range(10)])
    body = agent.post([rec(f"GPU-{n}", t, t + 60) for n in range(10, 17)], status=403)
    assert body["detail"] == [
        {
            "loc": ["body", "records"],
            "msg": f"node {agent.node_id} has 10 GPUs and reports 7 new ones: a node may have "
            "at most 16 (GPUMETER_MAX_GPUS_PER_NODE)",
            "type": "forbidden",
        }
    ]
    with transaction(db) as session:
        assert session.scalar(text("SELECT count(*) FROM gpus")) == 10


def test_resending_is_counted_as_duplicates_and_changes_nothing(agent: Agent, db: Engine) -> None:
    t = minute_ago(3)
    batch = [rec("GPU-1", t, t + 60), rec("GPU-1", t + 60, t + 90)]
    events = [event("GPU-1", t + 5, code=13)]
    assert agent.post(batch, events)["accepted"] == 2
    again = agent.post(batch, events)
    assert (again["accepted"], again["duplicates"]) == (0, 2)
    assert (again["events_accepted"], again["events_duplicate"]) == (0, 1)
    assert segments(db, "GPU-1") == [(t, t + 90, "healthy")]


def not_stored(body: dict[str, Any]) -> list[tuple[list[Any], str, str]]:
    return [(a["loc"], a["gpu_uuid"], a["outcome"]) for a in body["not_stored"]]


def test_a_uuid_clash_holds_only_the_disputed_gpus_items_until_an_operator_settles_it(
    agent: Agent, other_agent: Agent, console: Console, db: Engine
) -> None:
    t = minute_ago(4)
    agent.post([rec("GPU-1", t, t + 60), rec("GPU-3", t, t + 60)])
    # node-2 claims GPU-1: its other GPU is stored, GPU-1's record and event held.
    body = other_agent.post(
        [rec("GPU-2", t, t + 60), rec("GPU-1", t + 60, t + 120)], [event("GPU-1", t, code=13)]
    )
    assert (body["accepted"], body["events_accepted"]) == (1, 0)
    assert not_stored(body) == [
        (["records", 1], "GPU-1", "held"),
        (["events", 0], "GPU-1", "held"),
    ]
    assert "claimed by more than one node" in body["not_stored"][0]["reason"]
    assert segments(db, "GPU-2") == [(t, t + 60, "healthy")]
    clashes = console.client.get("/v1/events?type=gpu.uuid_clash", headers=console.headers)
    [clash] = clashes.json()["items"]
    assert (clash["subject"], clash["data"]) == (
        "gpu/GPU-1",
        {
            "gpu_uuid": "GPU-1",
            "registered_node_id": agent.node_id,
            "claiming_node_id": other_agent.node_id,
            "batch_id": "b-1",
        },
    )
    # In dispute, the registered node's reports of GPU-1 are held too; its GPU-3 is stored.
    body = agent.post([rec("GPU-1", t + 60, t + 120, "failed"), rec("GPU-3", t + 60, t + 120)])
    assert (body["accepted"], not_stored(body)) == (1, [(["records", 0], "GPU-1", "held")])
    assert segments(db, "GPU-1") == [(t, t + 60, "healthy")]
    assert segments(db, "GPU-3") == [(t, t + 120, "healthy")]
    claims = console.client.get("/v1/gpus/GPU-1/claims", headers=console.headers).json()
    assert claims["registered_node_id"] == agent.node_id and claims["disputed_at"]
    assert sorted((h["node_id"], h["records"], h["events"]) for h in claims["held"]) == sorted(
        [(agent.node_id, 1, 0), (other_agent.node_id, 1, 1)]
    )
    # The GPU is on node-2: its held record and event are stored, node-1's refused.
    settled = console.post("/v1/gpus/GPU-1/settle", {"node_id": other_agent.node_id}, 200)
    assert (settled["stored_records"], settled["stored_events"]) == (1, 1)
    [refused] = settled["refused"]
    assert (refused["node_id"], refused["records"], refused["events"]) == (agent.node_id, 1, 0)
    assert "settled to node" in refused["reason"]
    assert segments(db, "GPU-1") == [(t, t + 120, "healthy")]
    gpu = console.client.get("/v1/gpus/GPU-1", headers=console.headers).json()
    assert (gpu["node_id"], gpu["disputed_at"]) == (other_agent.node_id, None)
    # Settled: node-2 reports GPU-1 as its own; node-1's reports of it are refused outright.
    assert not_stored(other_agent.post([rec("GPU-1", t + 120, t + 180)])) == []
    body = agent.post([rec("GPU-1", t + 180, t + 240), rec("GPU-3", t + 120, t + 180)])
    assert (body["accepted"], not_stored(body)) == (1, [(["records", 0], "GPU-1", "refused")])
    assert segments(db, "GPU-1") == [(t, t + 180, "healthy")]


def test_a_retired_gpu_s_held_and_later_reports_are_refused(
    agent: Agent, other_agent: Agent, console: Console, db: Engine
) -> None:
    t = minute_ago(3)
    agent.post([rec("GPU-1", t, t + 60)])
    other_agent.post([rec("GPU-1", t, t + 60)])
    settled = console.post("/v1/gpus/GPU-1/settle", {"node_id": None}, 200)
    assert (settled["retired"], settled["stored_records"]) == (True, 0)
    assert [(r["node_id"], r["records"]) for r in settled["refused"]] == [(other_agent.node_id, 1)]
    body = agent.post([rec("GPU-1", t + 60, t + 120)])
    [answer] = body["not_stored"]
    assert (answer["outcome"], answer["reason"]) == (
        "refused",
        "GPU GPU-1 was retired by an operator",
    )
    assert segments(db, "GPU-1") == [(t, t + 60, "healthy")]


def test_settling_names_a_known_gpu_and_node(agent: Agent, console: Console) -> None:
    agent.post([rec("GPU-1", minute_ago(2), minute_ago(1))])
    for path, body, status, loc in [
        ("/v1/gpus/GPU-9/settle", {"node_id": agent.node_id}, 404, ["path", "gpu_uuid"]),
        ("/v1/gpus/GPU-1/settle", {"node_id": str(uuid.uuid4())}, 422, ["body", "node_id"]),
        ("/v1/gpus/GPU-1/settle", {}, 422, ["body", "node_id"]),
    ]:
        response = console.client.post(path, json=body, headers=console.headers)
        assert response.status_code == status, response.text
        assert response.json()["detail"][0]["loc"] == loc


def test_the_hold_of_a_disputed_gpu_is_bounded(
    app: FastAPI, agent: Agent, other_agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = minute_ago(3)
    agent.post([rec("GPU-1", t, t + 60)])
    held = [rec("GPU-1", t + i, t + i + 1) for i in range(3)]
    # The app's registry took the setting when the app was built: give it a smaller hold.
    writers = app.state.ingest_writers
    monkeypatch.setattr(writers, "gpus", replace(writers.gpus, hold_max=2))
    body = other_agent.post(held)
    assert [a["outcome"] for a in body["not_stored"]] == ["held", "held", "refused"]
    assert "hold is full (2 items" in body["not_stored"][2]["reason"]


def test_semantic_errors_list_every_bad_item(agent: Agent) -> None:
    t = minute_ago(3)
    future = minute_ago(-2)
    body = agent.post(
        [
            rec("GPU-1", t, t + 60),
            rec("GPU-1", t + 70, t + 70),  # start >= end
            rec("GPU-1", t + 50, t + 70),  # crosses a minute boundary
            rec("GPU-1", future, future + 10),  # in the future beyond the allowed skew
            rec("GPU-1", 1_000, 1_010),  # older than the retention
        ],
        [event("GPU-1", t, code=None)],  # an xid event without its code
        status=422,
    )
    assert locs(body) == [
        ["body", "records", 1, "end"],
        ["body", "records", 2, "end"],
        ["body", "records", 3, "end"],
        ["body", "records", 4, "start"],
        ["body", "events", 0, "code"],
    ]


def test_type_errors_list_every_bad_item(agent: Agent) -> None:
    t = minute_ago(3)
    body = agent.post(
        [rec("GPU-1", t, t + 60, state="sleepy"), {**rec("GPU-1", t, t + 60), "start": "soon"}],
        status=422,
    )
    assert ["body", "records", 0, "state"] in locs(body)
    assert ["body", "records", 1, "start"] in locs(body)


def test_malformed_json_is_rejected(client: TestClient, agent: Agent) -> None:
    response = client.post(
        "/v1/ingest",
        content=b'{"batch_id": "x", "records": [',
        headers={**bearer(agent.token), "Content-Type": "application/json"},
    )
    assert response.status_code == 422
    assert response.json()["detail"][0]["type"] == "json_invalid"


def test_ingest_answers_like_the_rest_of_the_api(
    client: TestClient, agent: Agent, admin_key: str
) -> None:
    """Served ahead of FastAPI's stack (``IngestEndpoint``), ingest still answers other
    methods, other media types and other keys in the API's one error shape, and is listed in
    the OpenAPI document with its schemas."""
    t = minute_ago(3)
    batch = {"batch_id": "b", "records": [rec("GPU-1", t, t + 60)]}
    other_method = client.get("/v1/ingest", headers=bearer(agent.token))
    assert (other_method.status_code, other_method.headers["allow"]) == (405, "POST")
    assert other_method.json()["detail"][0]["type"] == "http_error"
    form = client.post(
        "/v1/ingest",
        content=b"batch_id=b",
        headers={**bearer(agent.token), "Content-Type": "application/x-www-form-urlencoded"},
    )
    assert form.status_code == 415
    assert locs(form.json()) == [["header", "content-type"]]
    admin = client.post("/v1/ingest", json=batch, headers=bearer(admin_key))
    assert admin.status_code == 403
    assert admin.json()["detail"][0]["msg"] == "this endpoint needs a node key"
    typed = client.post(
        "/v1/ingest",
        json=batch,
        headers={**bearer(agent.token), "Content-Type": "application/json; charset=utf-8"},
    )
    assert typed.json() == {
        "batch_id": "b",
        "accepted": 1,
        "duplicates": 0,
        "events_accepted": 0,
        "events_duplicate": 0,
        "not_stored": [],
    }
    operation = client.get("/openapi.json").json()["paths"]["/v1/ingest"]["post"]
    schema = operation["requestBody"]["content"]["application/json"]["schema"]
    assert schema == {"$ref": "#/components/schemas/IngestBatch"}
    assert {"200", "401", "403", "409", "413", "415", "422", "503"} <= set(operation["responses"])


@pytest.fixture
def two_items_a_batch(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Before the app is built: ingest takes its settings from the composition root."""
    monkeypatch.setenv("GPUMETER_INGEST_MAX_ITEMS", "2")
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()  # later tests read the environment without it again


def test_batch_over_the_size_limit_is_rejected(two_items_a_batch: None, agent: Agent) -> None:
    t = minute_ago(3)
    body = agent.post([rec("GPU-1", t + i, t + i + 1) for i in range(3)], status=413)
    assert locs(body) == [["body"]]


def test_conflicting_records_are_listed_and_nothing_is_stored(agent: Agent, db: Engine) -> None:
    t = minute_ago(3)
    agent.post([rec("GPU-1", t, t + 30)])
    body = agent.post(
        [
            rec("GPU-1", t + 60, t + 120),  # new: would be stored, but the batch is atomic
            rec("GPU-2", t, t + 60),  # a new GPU: not registered either
            rec("GPU-1", t + 10, t + 20, "failed"),  # stored as healthy
            rec("GPU-1", t + 20, t + 40),  # only partly stored
        ],
        status=409,
    )
    assert locs(body) == [["body", "records", 2], ["body", "records", 3]]
    assert "'healthy'" in body["detail"][0]["msg"]
    assert segments(db, "GPU-1") == [(t, t + 30, "healthy")]
    with transaction(db) as session:
        assert session.get(Gpu, "GPU-2") is None


def test_segments_extend_merge_and_accept_late_records(agent: Agent, db: Engine) -> None:
    t = minute_ago(10)
    agent.post([rec("GPU-1", t, t + 60)])
    agent.post([rec("GPU-1", t + 60, t + 100)])  # extends in place
    agent.post([rec("GPU-1", t + 120, t + 180)])  # after a gap
    agent.post([rec("GPU-1", t + 180, t + 200, "failed"), rec("GPU-1", t + 200, t + 240)])
    assert segments(db, "GPU-1") == [
        (t, t + 100, "healthy"),
        (t + 120, t + 180, "healthy"),
        (t + 180, t + 200, "failed"),
        (t + 200, t + 240, "healthy"),
    ]
    agent.post([rec("GPU-1", t + 100, t + 120)])  # late: fills the gap and merges
    agent.post([rec("GPU-1", t - 60, t)])  # late: before everything
    assert segments(db, "GPU-1") == [
        (t - 60, t + 180, "healthy"),
        (t + 180, t + 200, "failed"),
        (t + 200, t + 240, "healthy"),
    ]


def test_state_change_event_is_the_failed_segments_evidence(
    agent: Agent, client: TestClient, console: Console
) -> None:
    t = minute_ago(5)
    change = event(
        "GPU-1",
        t + 30,
        "state_change",
        state="failed",
        rule="xid_79_fallen_off_bus",
        detail={"from": "healthy"},
    )
    agent.post([rec("GPU-1", t, t + 30)], [event("GPU-1", t + 30, code=79), change])
    agent.post([rec("GPU-1", t + 30, t + 60, "failed")])  # the record after its event
    timeline = client.get(
        f"/v1/gpus/GPU-1/timeline?start={t - 60}&end={t + 120}", headers=console.headers
    ).json()
    states = [(s["start_s"], s["end_s"], s["state"]) for s in timeline["segments"]]
    assert states == [(t, t + 30, "healthy"), (t + 30, t + 60, "failed")]
    evidence = timeline["segments"][1]["evidence"]
    assert (evidence["rule"], evidence["event_id"]) == ("xid_79_fallen_off_bus", change["event_id"])
    gaps = [(g["start_s"], g["end_s"]) for g in timeline["unmetered"]]
    assert gaps == [(t - 60, t), (t + 60, t + 120)]
    assert sorted(e["kind"] for e in timeline["events"]) == ["state_change", "xid"]
    health = client.get("/v1/fleet/health", headers=console.headers).json()
    assert health["recently_failed"][0]["gpu_uuid"] == "GPU-1"
    assert health["by_state_and_pool"] == [{"state": "failed", "pool": "quarantine", "gpus": 1}]


def test_metrics_are_aggregated_per_step(
    agent: Agent, client: TestClient, console: Console
) -> None:
    t = minute_ago(5) - minute_ago(5) % 120
    agent.post(
        [
            rec("GPU-1", t, t + 30, gpu_util_mean=20.0, gpu_util_max=40, energy_j=3000.0),
            rec(
                "GPU-1",
                t + 30,
                t + 60,
                "degraded",
                gpu_util_mean=40.0,
                gpu_util_max=60,
                energy_j=3000.0,
                temp_max_c=71,
            ),
            rec("GPU-1", t + 60, t + 120, gpu_util_mean=60.0, gpu_util_max=80, energy_j=6000.0),
        ]
    )
    url = f"/v1/gpus/GPU-1/metrics?start={t}&end={t + 120}"
    minutes = client.get(url, headers=console.headers).json()["points"]
    assert [
        (p["t_s"], p["observed_s"], p["gpu_util_mean"], p["gpu_util_max"]) for p in minutes
    ] == [(t, 60, 30.0, 60), (t + 60, 60, 60.0, 80)]
    assert minutes[0]["power_mean_w"] == 100.0 and minutes[0]["temp_max_c"] == 71
    two = client.get(url + "&step=120", headers=console.headers).json()["points"]
    assert [(p["observed_s"], p["gpu_util_mean"], p["energy_j"]) for p in two] == [
        (120, 45.0, 12000.0)
    ]
    too_fine = client.get(url + "&step=30", headers=console.headers)
    assert too_fine.status_code == 422


def test_customer_sees_only_the_rented_interval(
    agent: Agent, client: TestClient, console: Console
) -> None:
    t = minute_ago(10)
    agent.post([rec("GPU-1", t + 60 * i, t + 60 * (i + 1)) for i in range(4)])
    customer = console.customer()
    plan = console.plan()
    rental = console.rental(customer["id"], plan["id"], start_at=_iso(t + 60))
    console.client.patch("/v1/gpus/GPU-1", json={"pool": "rentable"}, headers=console.headers)
    console.assign(rental["id"], "GPU-1", _iso(t + 60), end_at=_iso(t + 150))
    key = console.post(f"/v1/customers/{customer['id']}/keys", {"name": "c"})["key"]
    timeline = client.get(
        f"/v1/gpus/GPU-1/timeline?start={t - 600}&end={t + 600}", headers=bearer(key)
    ).json()
    assert [(s["start_s"], s["end_s"]) for s in timeline["segments"]] == [(t + 60, t + 150)]
    assert timeline["unmetered"] == []
    points = client.get(f"/v1/gpus/GPU-1/metrics?start={t}&end={t + 600}", headers=bearer(key))
    assert [p["t_s"] for p in points.json()["points"]] == [t + 60, t + 120]


def _iso(second: int) -> str:
    return from_epoch(second).isoformat()


def test_event_ids_are_per_gpu(agent: Agent, other_agent: Agent, db: Engine) -> None:
    t = minute_ago(3)
    agent.post([], [{**event("GPU-1", t, code=13), "event_id": "xid-13"}])
    # Another node's GPU with the same event id: its own event, not a duplicate of GPU-1's.
    stored = other_agent.post([], [{**event("GPU-2", t + 1, code=79), "event_id": "xid-13"}])
    assert (stored["events_accepted"], stored["events_duplicate"]) == (1, 0)
    with db.connect() as conn:
        rows = conn.execute(
            text("SELECT gpu_uuid, code FROM health_events WHERE event_id = 'xid-13' ORDER BY 1")
        ).all()
    assert [tuple(r) for r in rows] == [("GPU-1", 13), ("GPU-2", 79)]


def test_an_event_id_resent_with_other_content_is_a_conflict(agent: Agent, db: Engine) -> None:
    t = minute_ago(3)
    first = {**event("GPU-1", t, code=13), "event_id": "e-1"}
    agent.post([], [first])
    body = agent.post([], [first, {**first, "code": 31}], status=409)
    assert [item["loc"] for item in body["detail"]] == [["body", "events", 1, "event_id"]]
    assert "event e-1 of GPU GPU-1" in body["detail"][0]["msg"]
    twice = {**event("GPU-1", t + 1, code=43), "event_id": "e-2"}  # twice in one batch
    agent.post([], [twice, {**twice, "code": 45}], status=409)
    with db.connect() as conn:
        stored = conn.execute(text("SELECT event_id, code FROM health_events")).all()
    assert [tuple(r) for r in stored] == [("e-1", 13)]


def test_event_detail_is_bounded_in_size_and_depth(agent: Agent) -> None:
    t = minute_ago(3)
    deep: dict[str, object] = {}
    for _ in range(9):
        deep = {"d": deep}
    events = [
        {**event("GPU-1", t, code=13), "detail": {"msg": "x" * 9000}},
        {**event("GPU-1", t + 1, code=13), "detail": deep},
    ]
    body = agent.post([], events, status=422)
    assert [(i["loc"], i["msg"]) for i in body["detail"]] == [
        (["body", "events", 0, "detail"], "must be at most 8192 bytes of JSON"),
        (["body", "events", 1, "detail"], "must nest at most 8 levels deep"),
    ]
