"""Browser hardening: the headers every answer carries, no-store where credentials came, and
the dashboard's sign-in and sign-out refusing a form posted from another site."""

from __future__ import annotations

from datetime import UTC, datetime

from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from app.billing.endpoints import clock
from app.core.browser import CSP, HSTS
from tests.billing.world import october_with_failure
from tests.harness import Console

HARDENING = {
    "content-security-policy": CSP,
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
}


def test_every_answer_carries_the_hardening_headers(client: TestClient, console: Console) -> None:
    anonymous = client.get("/dashboard/sign-in")
    assert {k: anonymous.headers.get(k) for k in HARDENING} == HARDENING
    assert "strict-transport-security" not in anonymous.headers  # plain http
    assert "frame-ancestors 'none'" in CSP
    keyed = client.get("/v1/customers", headers=console.headers)
    assert (keyed.status_code, keyed.headers["cache-control"]) == (200, "no-store")
    assert {k: keyed.headers.get(k) for k in HARDENING} == HARDENING


def test_hsts_when_served_over_tls(client: TestClient) -> None:
    behind_proxy = client.get("/healthz", headers={"X-Forwarded-Proto": "https"})
    assert behind_proxy.headers["strict-transport-security"] == HSTS
    with TestClient(client.app, base_url="https://testserver") as tls:
        assert tls.get("/healthz").headers["strict-transport-security"] == HSTS


def test_invoice_html_is_not_stored(app: FastAPI, console: Console, db: Engine) -> None:
    app.dependency_overrides[clock] = lambda: datetime(2026, 11, 5, 12, 0, tzinfo=UTC)
    october_with_failure(console, db)
    [invoice_id] = console.post("/v1/invoices/runs", {"period": "2026-10"}, 200)["invoice_ids"]
    page = console.client.get(f"/v1/invoices/{invoice_id}/html", headers=console.headers)
    assert (page.status_code, page.headers["content-type"]) == (200, "text/html; charset=utf-8")
    assert page.headers["cache-control"] == "no-store"
    assert page.headers["content-security-policy"] == CSP


def test_sign_in_and_out_refuse_a_form_from_another_site(
    client: TestClient, console: Console
) -> None:
    key = console.headers["Authorization"].removeprefix("Bearer ")
    form = {"api_key": key, "next": "/dashboard"}
    for headers in ({"Origin": "https://evil.example"}, {"Referer": "https://evil.example/x"}):
        refused = client.post("/dashboard/sign-in", data=form, headers=headers)
        assert refused.status_code == 403, refused.text
        assert "set-cookie" not in refused.headers
        out = client.post("/dashboard/sign-out", headers=headers, follow_redirects=False)
        assert out.status_code == 403
    own = client.post(
        "/dashboard/sign-in",
        data=form,
        headers={"Origin": "http://testserver"},
        follow_redirects=False,
    )
    assert own.status_code == 303 and "gpumeter_session" in own.headers["set-cookie"]
