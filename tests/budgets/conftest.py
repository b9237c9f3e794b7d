from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from fastapi import FastAPI

from app.billing.endpoints import clock
from tests.dashboard.conftest import client, seeded  # noqa: F401  (the dashboard's seeded month)

MID_OCTOBER = datetime(2026, 10, 11, 0, 0, tzinfo=UTC)  # Acme's rental half done


@pytest.fixture
def october(app: FastAPI) -> Iterator[None]:
    app.dependency_overrides[clock] = lambda: MID_OCTOBER
    yield
    app.dependency_overrides.pop(clock)
