"""Integers past a BIGINT are refused where they enter, and a value the database still refuses
is a JSON 422, never a 500."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import text

from app.core.deps import DbSession
from tests.harness import Console

PAST_BIGINT = "99999999999999999999"


def test_integer_path_parameters_past_a_bigint_are_a_422(console: Console) -> None:
    response = console.client.post(
        f"/v1/webhooks/deliveries/{PAST_BIGINT}/resend", headers=console.headers
    )
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["path", "delivery_id"]


def test_a_value_the_database_refuses_is_a_json_422(app: FastAPI, console: Console) -> None:
    @app.get("/test/out-of-range")
    def out_of_range(session: DbSession) -> int:
        return int(session.scalar(text(f"SELECT CAST('{PAST_BIGINT}' AS bigint)")))

    with TestClient(app) as client:
        response = client.get("/test/out-of-range")
    assert response.status_code == 422
    assert response.json()["detail"] == [
        {
            "loc": [],
            "msg": f'a value the database cannot store: value "{PAST_BIGINT}" is out of range '
            "for type bigint",
            "type": "unprocessable",
        }
    ]
