"""Idempotency keys on the API's POSTs (app.core.idempotency): a retry gets the first answer and
creates nothing, per tenant; another request under a key is a 422, a duplicate in flight a
409; only committed answers are kept, in the transaction of their effects; keys expire."""

from __future__ import annotations

import json
import threading
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from cryptography.fernet import Fernet
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from app.core import queue
from app.core.db import transaction
from app.core.idempotency import HEADER, purge_expired
from app.settings import get_settings
from tests.harness import Console, bearer, wait_for

TOP_UP = {"amount": "25.50", "reason": "bank transfer 2026-11-02"}


def top_up_path(customer: dict[str, Any]) -> str:
    return f"/v1/customers/{customer['id']}/balance/top-ups"


def top_ups(console: Console, customer: dict[str, Any]) -> list[dict[str, Any]]:
    path = f"/v1/customers/{customer['id']}/balance/entries"
    entries = console.client.get(path, headers=console.headers).json()["items"]
    return [e for e in entries if e["kind"] == "top_up"]


def post(console: Console, path: str, body: dict[str, Any], key: str) -> httpx.Response:
    return console.client.post(path, json=body, headers={**console.headers, HEADER: key})


def test_a_retry_gets_the_first_answer_and_creates_nothing(console: Console) -> None:
    acme, globex = console.customer("Acme"), console.customer("Globex")
    first = post(console, top_up_path(acme), TOP_UP, "top-up-7f3a")
    again = post(console, top_up_path(acme), TOP_UP, "top-up-7f3a")
    assert first.status_code == again.status_code == 201
    assert again.json() == first.json()
    assert again.headers["idempotent-replayed"] == "true"
    assert "idempotent-replayed" not in first.headers
    # The same request serialized otherwise (key order, spaces) is the same request.
    respaced = console.client.post(
        top_up_path(acme),
        content=json.dumps(dict(reversed(TOP_UP.items())), indent=2),
        headers={**console.headers, HEADER: "top-up-7f3a", "Content-Type": "application/json"},
    )
    assert respaced.json() == first.json() and respaced.headers["idempotent-replayed"] == "true"
    assert [e["amount"] for e in top_ups(console, acme)] == ["25.50"]
    # Another key is another top-up; the same key on another customer's path is another
    # request (a 422), never this one's answer.
    other = post(console, top_up_path(acme), TOP_UP, "top-up-7f3b")
    assert other.status_code == 201 and other.json()["seq"] != first.json()["seq"]
    assert [e["balance"] for e in top_ups(console, acme)] == ["51.00", "25.50"]
    wrong_path = post(console, top_up_path(globex), TOP_UP, "top-up-7f3a")
    assert wrong_path.status_code == 422
    assert top_ups(console, globex) == []


def test_keys_are_scoped_to_the_tenant(console: Console) -> None:
    """Two customers' scripts and the operator use the same key: each gets its own answer."""
    acme, globex = console.customer("Acme"), console.customer("Globex")
    created = {}
    for customer in (acme, globex):
        key = console.post(f"/v1/customers/{customer['id']}/keys", {"name": "ci"})["key"]
        path = f"/v1/customers/{customer['id']}/budgets"
        response = console.client.post(
            path, json={"amount": "100"}, headers={**bearer(key), HEADER: "monthly-budget"}
        )
        assert response.status_code == 201, response.text
        assert "idempotent-replayed" not in response.headers
        created[customer["id"]] = response.json()
        # The customer's retry is its own answer again.
        retry = console.client.post(
            path, json={"amount": "100"}, headers={**bearer(key), HEADER: "monthly-budget"}
        )
        assert retry.json() == response.json()
    assert created[acme["id"]]["id"] != created[globex["id"]]["id"]
    assert {b["customer_id"] for b in created.values()} == {acme["id"], globex["id"]}
    # The operator's admin key has a namespace of its own too.
    admins = post(
        console, f"/v1/customers/{acme['id']}/budgets", {"amount": "100"}, "monthly-budget"
    )
    assert admins.status_code == 201
    assert admins.json()["id"] not in {b["id"] for b in created.values()}


def test_the_key_with_another_body_is_a_422_naming_the_first_request(console: Console) -> None:
    acme = console.customer("Acme")
    path = top_up_path(acme)
    assert post(console, path, TOP_UP, "k-1").status_code == 201
    other = post(console, path, {**TOP_UP, "amount": "99.00"}, "k-1")
    assert other.status_code == 422
    [problem] = other.json()["detail"]
    assert problem["loc"] == ["header", "idempotency-key"]
    assert problem["msg"].startswith(f"this Idempotency-Key was first used for POST {path} ")
    assert "another body" in problem["msg"]
    assert [e["amount"] for e in top_ups(console, acme)] == ["25.50"]


@pytest.mark.parametrize("key", ["", "x" * 256, "schlüssel", "two words"])
def test_a_malformed_key_is_a_422(console: Console, key: str) -> None:
    acme = console.customer("Acme")
    response = console.client.post(
        top_up_path(acme),
        json=TOP_UP,
        headers={**console.headers, HEADER: key.encode()},
    )
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["header", "idempotency-key"]
    assert top_ups(console, acme) == []


def test_an_answer_that_changed_nothing_is_not_kept(console: Console) -> None:
    """A refused request rolled back: its key runs the corrected request (Stripe keeps only
    requests that began executing; here nothing of a refused one remains)."""
    acme = console.customer("Acme")
    refused = post(console, top_up_path(acme), {**TOP_UP, "amount": "0.001"}, "k-2")
    assert refused.status_code == 422
    accepted = post(console, top_up_path(acme), TOP_UP, "k-2")
    assert accepted.status_code == 201
    assert "idempotent-replayed" not in accepted.headers


def test_a_duplicate_while_the_first_runs_is_a_409(console: Console, db: Engine) -> None:
    acme = console.customer("Acme")
    path = top_up_path(acme)
    answers: dict[str, httpx.Response] = {}

    def send(name: str) -> threading.Thread:
        def run() -> None:
            answers[name] = post(console, path, TOP_UP, "k-3")

        thread = threading.Thread(target=run)
        thread.start()
        return thread

    with db.connect() as blocker:
        # The first request's insert waits on this lock, holding its key meanwhile.
        blocker.execute(text("LOCK TABLE balance_entries IN EXCLUSIVE MODE"))
        first = send("first")
        try:
            wait_for(lambda: lock_waiters(db) > 0, "the first request to wait on the lock")
            duplicate = send("duplicate")
            duplicate.join(timeout=10)  # answered at once, without waiting for the first
            assert "duplicate" in answers, "the duplicate waited for the first request"
        finally:
            blocker.rollback()
            first.join(timeout=30)
    assert answers["duplicate"].status_code == 409
    [problem] = answers["duplicate"].json()["detail"]
    assert problem["loc"] == ["header", "idempotency-key"] and "still running" in problem["msg"]
    assert answers["first"].status_code == 201
    after = post(console, path, TOP_UP, "k-3")
    assert after.json() == answers["first"].json()
    assert after.headers["idempotent-replayed"] == "true"
    assert len(top_ups(console, acme)) == 1


def lock_waiters(db: Engine) -> int:
    with db.connect() as connection:
        return int(
            connection.scalar(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND datname = current_database()"
                )
            )
        )


def test_an_expired_key_runs_again_and_the_purge_removes_only_expired_ones(
    console: Console, db: Engine
) -> None:
    acme = console.customer("Acme")
    path = top_up_path(acme)
    for key in ("old", "older", "fresh"):
        assert post(console, path, TOP_UP, key).status_code == 201
    with transaction(db) as session:
        session.execute(
            text(
                "UPDATE idempotency_keys SET created_at = now() - interval '25 hours' "
                "- (CASE key WHEN 'older' THEN interval '1 hour' ELSE interval '0' END) "
                "WHERE key IN ('old', 'older')"
            )
        )
    # Past the 24 h, the key is free again: its request runs (a new top-up).
    rerun = post(console, path, TOP_UP, "old")
    assert rerun.status_code == 201 and "idempotent-replayed" not in rerun.headers
    assert len(top_ups(console, acme)) == 4
    with transaction(db) as session:
        session.execute(
            text(
                "UPDATE idempotency_keys SET created_at = now() - interval '25 hours' "
                "WHERE key = 'old'"
            )
        )
    day = timedelta(hours=24)
    with transaction(db) as session:  # bounded: one per run here, the oldest first
        assert purge_expired(session, day, limit=1) == 1
    with transaction(db) as session:
        assert stored_keys(session) == ["fresh", "old"]
        assert purge_expired(session, day) == 1
        assert purge_expired(session, day) == 0
        assert stored_keys(session) == ["fresh"]


def stored_keys(session: Any) -> list[str]:
    return list(session.scalars(text("SELECT key FROM idempotency_keys ORDER BY key")))


def test_the_answer_commits_with_the_effects_or_neither_does(
    app: FastAPI, console: Console, db: Engine
) -> None:
    """Storing the answer fails (a trigger refuses it, as a crash at that point would): the
    top-up it would have answered is rolled back with it, and the client gets the API's 500."""
    acme = console.customer("Acme")
    refuse = (
        "CREATE FUNCTION refuse_answers() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN RAISE EXCEPTION 'disk full'; END $$; "
        "CREATE TRIGGER refuse_answers BEFORE INSERT ON idempotency_keys "
        "FOR EACH ROW EXECUTE FUNCTION refuse_answers()"
    )
    with transaction(db) as session:
        session.execute(text(refuse))
    try:
        with TestClient(app, raise_server_exceptions=False) as client:
            response = client.post(
                top_up_path(acme), json=TOP_UP, headers={**console.headers, HEADER: "k-4"}
            )
    finally:
        with transaction(db) as session:
            session.execute(text("DROP FUNCTION refuse_answers() CASCADE"))
    assert response.status_code == 500
    assert response.json()["detail"][0]["type"] == "internal_error"
    assert top_ups(console, acme) == []
    # The retry runs it (nothing was kept) and it counts once.
    assert post(console, top_up_path(acme), TOP_UP, "k-4").status_code == 201
    assert len(top_ups(console, acme)) == 1


def test_every_post_but_ingest_and_stripes_documents_the_header(app: FastAPI) -> None:
    paths = app.openapi()["paths"]
    posts = {path: ops["post"] for path, ops in paths.items() if "post" in ops}
    with_header = {
        path
        for path, op in posts.items()
        if any(p["name"] == HEADER and p["in"] == "header" for p in op.get("parameters", []))
    }
    assert set(posts) - with_header == {"/v1/ingest", "/v1/stripe/webhook"}
    assert "/v1/rentals/{rental_id}/migrations" in with_header
    assert "/v1/invoices/runs" in with_header


def test_a_kept_answer_is_encrypted_at_rest(
    console: Console, db: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new API key is shown once: its answer, kept for the retry, is stored encrypted. Once
    the encryption key that wrote it is retired, the retry is a 409, never a new key."""
    acme = console.customer("Acme")
    path = f"/v1/customers/{acme['id']}/keys"
    first = post(console, path, {"name": "ci"}, "new-key-1")
    assert first.status_code == 201
    secret = first.json()["key"]
    with db.connect() as connection:
        stored = connection.scalar(text("SELECT body FROM idempotency_keys"))
    assert secret.encode() not in stored and b'"name"' not in stored
    assert post(console, path, {"name": "ci"}, "new-key-1").json()["key"] == secret
    monkeypatch.setenv("GPUMETER_ENCRYPTION_KEYS", json.dumps([Fernet.generate_key().decode()]))
    get_settings.cache_clear()
    try:
        retired = post(console, path, {"name": "ci"}, "new-key-1")
    finally:
        monkeypatch.undo()
        get_settings.cache_clear()
    assert retired.status_code == 409
    assert "can no longer be read" in retired.json()["detail"][0]["msg"]
    keys = console.client.get(path, headers=console.headers).json()["items"]
    assert len(keys) == 1


def test_the_purge_job_runs_every_5_minutes_under_the_ttl_setting(
    console: Console, db: Engine
) -> None:
    task = queue.queue.tasks["idempotency:purge"]
    assert task.queueing_lock == "idempotency_purge"
    periodic = queue.queue.periodic_registry.periodic_tasks.values()
    assert [p.cron for p in periodic if p.task is task] == ["*/5 * * * *"]
    acme = console.customer("Acme")
    for key in ("two-hours-old", "new"):
        assert post(console, top_up_path(acme), TOP_UP, key).status_code == 201
    with transaction(db) as session:
        session.execute(
            text(
                "UPDATE idempotency_keys SET created_at = now() - interval '2 hours' "
                "WHERE key = 'two-hours-old'"
            )
        )
    settings = get_settings().model_copy(update={"idempotency_key_ttl_s": 3600})
    context = SimpleNamespace(additional_context={"engine": db, "settings": settings})
    assert task.func(context, 0) == 1
    with transaction(db) as session:
        assert stored_keys(session) == ["new"]
