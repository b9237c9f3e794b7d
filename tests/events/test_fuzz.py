"""Fuzz GET /v1/events from its OpenAPI schema (schemathesis, in-process): never a 5xx.

The cursor is digits by its schema's pattern, so the fuzzer sends numbers of every length up to
20 digits, past a BIGINT's end too (``?after=99999999999999999999`` was a plain-text 500)."""

from __future__ import annotations

import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, given, settings

from tests.harness import Console


def test_events_never_answer_5xx(app: FastAPI, console: Console) -> None:
    operation = schemathesis.openapi.from_asgi("/openapi.json", app)["/v1/events"]["GET"]

    @given(case=operation.as_strategy())
    @settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
    def fuzz(case: schemathesis.Case) -> None:
        response = case.call(headers=console.headers)
        assert response.status_code < 500, response.text

    fuzz()
