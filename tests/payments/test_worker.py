"""The two ways the sync runs: `gpumeter stripe sync` and a job of the service's queue worker."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from app.main import create_app
from app.settings import Settings
from tests.payments.conftest import TOTAL_MINOR, Mirror
from tests.payments.fake_stripe import FakeStripe

GPUMETER = Path(sys.executable).parent / "gpumeter"


def run_cli(database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUMETER_")}
    env |= {k: v for k, v in os.environ.items() if k.startswith("GPUMETER_STRIPE_")}
    env["GPUMETER_DATABASE_URL"] = database_url
    return subprocess.run(
        [str(GPUMETER), "stripe", "sync", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_cli_sync_mirrors_what_is_due(mirror: Mirror, fake: FakeStripe, database_url: str) -> None:
    invoice_id = mirror.finalized()
    result = run_cli(database_url)
    assert result.returncode == 0, result.stderr
    assert "1 invoice(s) worked" in result.stdout
    assert mirror.row(invoice_id)["state"] == "synced"
    assert fake.invoice(mirror.invoice(invoice_id).stripe_invoice_id)["amount_due"] == TOTAL_MINOR


def test_cli_refuses_to_run_without_a_key(
    settings: Settings, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GPUMETER_STRIPE_API_KEY")
    result = run_cli(database_url)
    assert result.returncode == 2
    assert "GPUMETER_STRIPE_API_KEY is not set" in result.stderr


def test_finalizing_has_the_in_process_worker_mirror_it(
    db: Engine, mirror: Mirror, fake: FakeStripe
) -> None:
    """The finalization defers the sync job in its transaction; the worker runs it."""
    with TestClient(create_app(db, worker=True)):
        invoice_id = mirror.finalized()
        deadline = time.monotonic() + 10
        while mirror.row(invoice_id)["state"] != "synced" and time.monotonic() < deadline:
            time.sleep(0.1)
    assert mirror.row(invoice_id)["state"] == "synced"
    assert fake.invoice(mirror.invoice(invoice_id).stripe_invoice_id)["status"] == "open"
