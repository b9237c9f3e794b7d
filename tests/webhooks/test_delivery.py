"""Webhooks delivered by a real worker to a real receiver that verifies every signature."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from app.billing.endpoints import clock
from app.main import create_app
from app.settings import Settings, get_settings
from tests.billing.world import october_with_failure
from tests.harness import Console, wait_for
from tests.metering.conftest import Agent, event, minute_ago, rec
from tests.webhooks.conftest import register
from tests.webhooks.receiver import Receiver

NOW = datetime(2026, 11, 5, 12, 0, tzinfo=UTC)


def all_events(console: Console) -> list[dict[str, Any]]:
    return console.client.get("/v1/events?limit=1000", headers=console.headers).json()["items"]


def deliveries(console: Console, endpoint: dict[str, Any]) -> list[dict[str, Any]]:
    path = f"/v1/webhooks/endpoints/{endpoint['id']}/deliveries"
    return console.client.get(path, headers=console.headers).json()["items"]


def statuses(log: list[dict[str, Any]]) -> set[str]:
    return {d["status"] for d in log}


def test_every_event_type_is_delivered_signed_with_its_event_id(
    app: FastAPI,
    console: Console,
    db: Engine,
    receiver: Receiver,
    monkeypatch: pytest.MonkeyPatch,
    settings: Settings,
) -> None:
    monkeypatch.setenv("GPUMETER_WEBHOOK_DISABLE_AFTER_S", "0")  # the first failure disables
    get_settings.cache_clear()
    with TestClient(create_app(db, worker=True)):
        _every_event_type(app, console, db, receiver)


def _every_event_type(app: FastAPI, console: Console, db: Engine, receiver: Receiver) -> None:
    app.dependency_overrides[clock] = lambda: NOW
    endpoint = register(console, receiver, "/all")
    dead = console.post(  # nothing listens there: it fails once and is disabled
        "/v1/webhooks/endpoints",
        {"url": "http://127.0.0.1:9/", "event_types": ["gpu.state_changed"]},
    )
    october_with_failure(console, db)  # rental.migrated
    [invoice_id] = console.post("/v1/invoices/runs", {"period": "2026-10"}, 200)["invoice_ids"]
    console.post(f"/v1/invoices/{invoice_id}/finalize", {}, 200)
    console.post(f"/v1/invoices/{invoice_id}/void", {"reason": "wrong address"}, 200)
    [again] = console.post("/v1/invoices/runs", {"period": "2026-10"}, 200)["invoice_ids"]
    console.post(f"/v1/invoices/{again}/finalize", {}, 200)
    console.post(f"/v1/invoices/{again}/paid", {}, 200)
    registered = console.node("node-9")
    agent = Agent(console.client, registered["node"]["id"], registered["token"]["key"])
    t = minute_ago(3)
    agent.post([rec("GPU-9", t, t + 30)])
    agent.post([rec("GPU-9", t + 30, t + 60, "failed")], [event("GPU-9", t + 30, code=79)])

    expected = {
        "rental.migrated",
        "invoice.finalized",
        "invoice.voided",
        "invoice.paid",
        "voucher.issued",  # October's tier voucher, issued at finalization
        "gpu.state_changed",
        "webhook_endpoint.disabled",
    }
    wait_for(lambda: {e["type"] for e in all_events(console)} == expected, "every event type")
    published = all_events(console)
    wait_for(lambda: len(receiver.ids("/all")) >= len(published), "every event delivered")
    assert receiver.rejected == []  # every signature verified
    assert sorted(receiver.ids("/all")) == sorted(e["id"] for e in published)
    by_id = {body["id"]: body for body in receiver.bodies("/all")}
    assert all(by_id[e["id"]] == e for e in published)  # the body is the event, as the API has it
    disabled = next(e for e in published if e["type"] == "webhook_endpoint.disabled")
    assert disabled["data"]["endpoint_id"] == dead["id"]
    # The worker records an attempt after the receiver answers, so the log can trail the receiver.
    wait_for(lambda: statuses(deliveries(console, endpoint)) == {"succeeded"}, "succeeded logs")
    log = deliveries(console, endpoint)
    assert all(d["log"][0]["status_code"] == 204 and d["log"][0]["duration_ms"] >= 0 for d in log)
    [failed] = deliveries(console, dead)
    assert (failed["status"], failed["log"][0]["status_code"]) == ("failed", None)
    assert failed["log"][0]["error"].startswith("ConnectError")
