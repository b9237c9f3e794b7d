from __future__ import annotations

from collections.abc import Iterator

import pytest

from app.settings import get_settings


@pytest.fixture
def trial(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A 10.00 signup credit and a low-balance line at 2.00 (the suite runs with no credit)."""
    monkeypatch.setenv("GPUMETER_TRIAL_CREDIT", "10.00")
    monkeypatch.setenv("GPUMETER_BALANCE_LOW_THRESHOLD", "2.00")
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()
