"""Billing tests: the API harness (tests/conftest.py) with the API's clock pinned."""

from datetime import UTC, datetime

import pytest
from fastapi import FastAPI

from app.billing.endpoints import clock

# After October's grace time, before November's end. Telemetry written by the tests gets the
# database's real time as received_at, which is later than this, as late data must be.
NOW = datetime(2026, 11, 5, 12, 0, tzinfo=UTC)


@pytest.fixture
def now(app: FastAPI) -> datetime:
    """Pin the API's clock."""
    app.dependency_overrides[clock] = lambda: NOW
    return NOW
