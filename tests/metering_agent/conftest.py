"""Fixtures for the agent tests."""

from collections.abc import Iterator

import pytest

from tests.e2e.conftest import fleet  # noqa: F401  (the real service, for e2e tests here)
from tests.metering_agent.agent_helpers import Sink, serve_sink


@pytest.fixture
def sink() -> Iterator[Sink]:
    state, server = serve_sink()
    yield state
    server.shutdown()
    server.server_close()
