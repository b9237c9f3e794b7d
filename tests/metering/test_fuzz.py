"""Fuzz POST /v1/ingest from its OpenAPI schema (schemathesis, in-process): never a 5xx."""

from __future__ import annotations

import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, given, settings

from tests.metering.conftest import Agent


def test_ingest_never_answers_5xx(app: FastAPI, agent: Agent) -> None:
    operation = schemathesis.openapi.from_asgi("/openapi.json", app)["/v1/ingest"]["POST"]
    headers = {"Authorization": f"Bearer {agent.token}"}

    @given(case=operation.as_strategy())
    @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
    def fuzz(case: schemathesis.Case) -> None:
        response = case.call(headers=headers)
        assert response.status_code < 500, response.text

    fuzz()
