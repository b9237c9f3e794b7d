"""`gpumeter invoices run` as an operator runs it: a real process on the test database."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import pytest
from sqlalchemy import Engine

from tests.billing.world import get, october_with_failure
from tests.harness import Console, Ran

GPUMETER = Path(sys.executable).parent / "gpumeter"


def _run(database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GPUMETER_DATABASE_URL": database_url}
    command = [str(GPUMETER), "invoices", "run", *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)


def test_invoices_run_drafts_then_finalizes_idempotently(
    console: Console, db: Engine, database_url: str
) -> None:
    october_with_failure(console, db)
    for _ in range(2):
        drafted = _run(database_url, "--period", "2026-10")
        assert drafted.returncode == 0, drafted.stderr
        assert "1 customers: 1 drafted, 0 finalized" in drafted.stdout
        assert "[####" in drafted.stderr and "1/1 customers" in drafted.stderr
    finalized = _run(database_url, "--period", "2026-10", "--finalize")
    assert "1 finalized" in finalized.stdout, finalized.stderr
    again = _run(database_url, "--period", "2026-10", "--finalize")
    assert "0 finalized, 1 unchanged" in again.stdout
    listed = console.client.get("/v1/invoices", headers=console.headers).json()["items"]
    assert [(i["number"], i["total"]) for i in listed] == [("GM-2026-000001", "2202.20")]


def test_invoices_run_refuses_bad_arguments_before_starting_anything(tmp_path: Path) -> None:
    """No database is configured: a wrong argument is refused before an embedded Postgres
    starts (its data directory is never made) and before any log line."""
    env = {k: v for k, v in os.environ.items() if k != "GPUMETER_DATABASE_URL"}
    data_dir = tmp_path / "data"
    for args, message in (
        (["--period", "2026-13"], "give a billing month as YYYY-MM, 1970-01 to 2999-12, not "),
        (["--period", "2099-01"], "period 2099-01 has not started yet"),
        (["--period", "2026-10", "--as-of", "2026-11-02T06:00:00"], "give the zone too"),
        (["--period", "2026-10", "--as-of", "2099-01-01T00:00Z"], "is in the future"),
        (["--period", "2026-10", "--customer", "acme"], "not a customer id (a UUID): 'acme'"),
    ):
        command = [str(GPUMETER), "invoices", "run", *args, "--data-dir", str(data_dir)]
        result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
        assert (result.returncode, result.stdout) == (2, ""), result.stderr
        assert result.stderr.startswith("usage: gpumeter invoices run ")
        error = result.stderr.splitlines()[-1]
        assert error.startswith("gpumeter invoices run: error: argument ") and message in error
        assert not data_dir.exists()


def test_invoices_run_as_of_a_past_time(console: Console, db: Engine, database_url: str) -> None:
    """A backfill finalized as of 2 Nov 06:00: generated, finalized and due (30 days) then."""
    october_with_failure(console, db)
    done = _run(database_url, "--period", "2026-10", "--finalize", "--as-of", "2026-11-02T06:00Z")
    assert done.returncode == 0 and "1 finalized" in done.stdout, done.stderr
    [invoice] = console.client.get("/v1/invoices", headers=console.headers).json()["items"]
    assert (invoice["generated_at"], invoice["finalized_at"], invoice["due_at"]) == (
        "2026-11-02T06:00:00Z",
        "2026-11-02T06:00:00Z",
        "2026-12-02T06:00:00Z",
    )


def test_invoices_list_show_finalize_and_void_as_the_api_does(
    console: Console, db: Engine, gpumeter: Callable[..., Ran]
) -> None:
    world = october_with_failure(console, db)
    assert gpumeter("invoices", "run", "--period", "2026-10").code == 0
    [draft] = get(console, "/v1/invoices")["items"]
    customer_id, rental_id = world.customer["id"], world.rental["id"]

    listed = gpumeter("invoices", "list")
    assert listed.code == 0, listed.err
    assert re.split(r"\s{2,}", listed.out.splitlines()[0].strip()) == [
        "ID",
        "NUMBER",
        "CUSTOMER",
        "PERIOD",
        "STATUS",
        "TOTAL",
        "AMOUNT DUE",
        "DUE",
    ]
    assert listed.rows() == [
        [draft["id"], "-", customer_id, "2026-10", "draft", "2202.20 USD", "2202.20 USD", "-"]
    ]
    as_json = gpumeter("invoices", "list", "--json")
    assert json.loads(as_json.out) == get(console, "/v1/invoices")
    assert gpumeter("invoices", "list", "--status", "finalized").out == "no invoices\n"
    assert gpumeter("invoices", "list", "--period", "2026-09").out == "no invoices\n"

    shown = gpumeter("invoices", "show", draft["id"])
    assert shown.code == 0, shown.err
    header, lines = shown.out.split("\n\n")
    assert "total       2202.20 USD" in header.splitlines()
    assert "tax         351.61 USD (19 %)" in header.splitlines()
    assert [row[:2] + row[-3:] for row in Ran(0, lines, "").rows()] == [
        ["0", "GPU time", "2678400", "2.49", "1852.56"],
        ["1", "Failure credit", "2820", "2.49", "-1.95"],
        ["2", "Migration credit", "30", "2.49", "-0.02"],
        ["3", "Tax", "-", "0.19", "351.61"],
    ]
    assert Ran(0, lines, "").rows()[1][2] == (
        f"H100, rental {rental_id}, GPU GPU-A, 2026-10-10 12:00:00Z to 2026-10-10 12:47:00Z"
    )
    shown_json = gpumeter("invoices", "show", draft["id"], "--json")
    assert json.loads(shown_json.out) == get(console, f"/v1/invoices/{draft['id']}")

    finalized = gpumeter("invoices", "finalize", draft["id"], "--json")
    assert finalized.code == 0, finalized.err
    invoice = get(console, f"/v1/invoices/{draft['id']}")
    assert json.loads(finalized.out) == invoice
    assert (invoice["number"], invoice["status"], invoice["total"]) == (
        "GM-2026-000001",
        "finalized",
        "2202.20",
    )
    again = gpumeter("invoices", "finalize", draft["id"])
    assert (again.code, again.out) == (2, "")
    assert again.err == "gpumeter invoices finalize: invoice GM-2026-000001 is already finalized\n"

    voided = gpumeter("invoices", "void", draft["id"], "--reason", "wrong rate", "--yes")
    assert voided.code == 0, voided.err
    assert "status      void" in voided.out.splitlines()
    invoice = get(console, f"/v1/invoices/{draft['id']}")
    assert (invoice["status"], invoice["void_reason"]) == ("void", "wrong rate")
    twice = gpumeter("invoices", "void", draft["id"], "--reason", "again", "--yes")
    assert (twice.code, twice.err) == (
        2,
        "gpumeter invoices void: only a finalized invoice can be voided; this one is void\n",
    )


def test_invoice_commands_refuse_unknown_ids_and_bad_arguments(
    gpumeter: Callable[..., Ran],
) -> None:
    unknown = "00000000-0000-0000-0000-000000000001"
    for action in ("show", "finalize"):
        refused = gpumeter("invoices", action, unknown)
        assert (refused.code, refused.out) == (2, "")
        assert refused.err == f"gpumeter invoices {action}: invoice {unknown} not found\n"
    no_reason = gpumeter("invoices", "void", unknown, "--reason", "")
    assert no_reason.code == 2
    assert "argument --reason: String should have at least 1 character" in no_reason.err
    not_an_id = gpumeter("invoices", "show", "GM-2026-000001")
    assert not_an_id.code == 2
    assert "argument invoice_id: not an invoice id (a UUID): 'GM-2026-000001'" in not_an_id.err
    for moment in ("0001-01-01T00:00:00+01:00", "1969-12-31T23:59:59Z"):
        year_one = gpumeter("invoices", "run", "--period", "2026-10", "--as-of", moment)
        assert year_one.code == 2
        assert (
            f"argument --as-of: {datetime.fromisoformat(moment).isoformat()} is out of range: "
            in (year_one.err)
        )
    bad_status = gpumeter("invoices", "list", "--status", "open")
    assert bad_status.code == 2
    assert (
        "argument --status: give one of draft, finalized, paid, void, not 'open'" in bad_status.err
    )


class _Terminal(io.StringIO):
    """An operator's terminal typing ``answer``."""

    def isatty(self) -> bool:
        return True


def test_invoices_void_asks_for_confirmation_or_yes(
    console: Console, db: Engine, gpumeter: Callable[..., Ran], monkeypatch: pytest.MonkeyPatch
) -> None:
    october_with_failure(console, db)
    run = gpumeter("invoices", "run", "--period", "2026-10", "--finalize")
    assert run.code == 0, run.err
    [invoice] = get(console, "/v1/invoices")["items"]
    void = ("invoices", "void", invoice["id"], "--reason", "wrong rate")

    scripted = gpumeter(*void)  # no terminal and no --yes: nothing is voided
    assert (scripted.code, scripted.out) == (1, "")
    assert f"Void invoice GM-2026-000001 of customer {invoice['customer_id']} for 2026-10 " in (
        scripted.err
    )
    assert "(amount due 2202.20 USD)" in scripted.err
    assert "pass --yes to confirm" in scripted.err and scripted.err.endswith("not voided\n")
    monkeypatch.setattr("sys.stdin", _Terminal("n\n"))
    declined = gpumeter(*void)
    assert declined.code == 1 and "[y/N]" in declined.err
    assert get(console, f"/v1/invoices/{invoice['id']}")["status"] == "finalized"

    monkeypatch.setattr("sys.stdin", _Terminal("y\n"))
    assert gpumeter(*void).code == 0
    assert get(console, f"/v1/invoices/{invoice['id']}")["status"] == "void"
