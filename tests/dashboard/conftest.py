"""Dashboard tests: the API harness over https (the session cookie is Secure) and a seeded month."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from tests.dashboard import world
from tests.harness import Console


@pytest.fixture
def client(app: FastAPI) -> Iterator[TestClient]:
    with TestClient(app, base_url="https://testserver") as test_client:
        yield test_client


@pytest.fixture
def seeded(console: Console) -> world.World:
    return world.build(console)
