"""DB-level billing tests reuse the API harness (app, client, admin key, console)."""

from datetime import UTC, datetime

import pytest
from fastapi import FastAPI

from app.billing.endpoints import clock
from tests.service.conftest import admin_key, app, client, console  # noqa: F401 - fixtures

# After October's grace time, before November's end. Telemetry written by the tests gets the
# database's real time as received_at, which is later than this, as late data must be.
NOW = datetime(2026, 11, 5, 12, 0, tzinfo=UTC)


@pytest.fixture
def now(app: FastAPI) -> datetime:  # noqa: F811 - the imported fixture
    """Pin the API's clock."""
    app.dependency_overrides[clock] = lambda: NOW
    return NOW
