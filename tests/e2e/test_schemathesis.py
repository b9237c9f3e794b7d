"""No 5xx from any input: schemathesis over the whole OpenAPI, against a real `gpumeter serve`.

Bounded (a fixed example budget per operation, deterministic generation, no shrinking) so the
run takes about a minute on two cores. It runs with an admin key and with a customer key, with
every check (`--checks all` but two about what is accepted, see below): any 5xx, or a status the
OpenAPI does not document, fails it.

The admin run is three runs that CI's end-to-end workers take side by side (each with a service
of its own): the coverage phase (each operation on its own, no state shared between them) over
two halves of the paths, and the other phases over every operation. Together they send what one
run sent; apart, the longest test in CI is a third of what it was.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import Engine

from app.auth.models import KeyKind
from app.auth.service import issue_key
from app.core.db import transaction
from app.core.local_service import free_port, wait_until_ready
from app.core.processes import stop_child

BIN = Path(sys.executable).parent
# Examples per operation and key: CI's budget is the default, GPUMETER_SCHEMATHESIS_EXAMPLES=<n>
# sets both for a longer run.
EXAMPLES_PER_OPERATION = {"admin": 5, "customer": 3}
# The coverage phase sends each parameter's boundary and wrong-type values: 3,900 cases, 70 %
# of a run. The admin runs send them all. A customer key is refused (403/404) before its input
# is looked at on most operations, and the input checks it reaches are the admin run's, so the
# customer run skips that phase and fuzzes and walks the customer's own routes instead.
STATEFUL = "examples,fuzzing,stateful"
# About half of the coverage phase's cases (by parameters and bodies per operation).
HALF = "^/v1/(customers|rentals|invoices)"
# Run -> key, phases, operations (schemathesis's filter options).
RUNS = {
    "admin-coverage-1": ("admin", "coverage", ["--include-path-regex", HALF]),
    "admin-coverage-2": ("admin", "coverage", ["--exclude-path-regex", HALF]),
    "admin": ("admin", STATEFUL, []),
    "customer": ("customer", STATEFUL, []),
}


@pytest.fixture(scope="module")
def served(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    logs = tmp_path_factory.mktemp("schemathesis")
    env = {
        **os.environ,
        "GPUMETER_DATABASE_URL": database_url,
        "GPUMETER_LOG_LEVEL": "error",
        # Its auth checks send wrong keys on purpose: unthrottled, its valid-key requests
        # keep reaching the routes (the throttle has tests of its own: tests/auth).
        "GPUMETER_AUTH_FAILURES_PER_WINDOW": "1000000",
    }
    with (logs / "serve.log").open("wb") as log:
        process = subprocess.Popen(
            [BIN / "gpumeter", "serve", "--port", str(port)], env=env, stderr=log
        )
    try:
        wait_until_ready(f"http://127.0.0.1:{port}", process, timeout_s=60)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_child(process, "service")


def keys(db: Engine, base: str) -> dict[str, str]:
    with transaction(db) as session:
        admin = issue_key(session, KeyKind.ADMIN, "schemathesis admin").secret
    customer = httpx.post(
        f"{base}/v1/customers", json={"name": "Fuzz"}, headers={"Authorization": f"Bearer {admin}"}
    ).json()
    with transaction(db) as session:
        secret = issue_key(session, KeyKind.CUSTOMER, "fuzz", customer_id=customer["id"]).secret
    return {"admin": admin, "customer": secret}


@pytest.mark.e2e
@pytest.mark.parametrize("run", list(RUNS))
def test_no_input_gets_a_5xx_or_an_undocumented_status(
    served: str, db: Engine, run: str, tmp_path: Path
) -> None:
    kind, phases, operations = RUNS[run]
    key = keys(db, served)[kind]
    result = subprocess.run(
        [
            BIN / "schemathesis",
            "run",
            f"{served}/openapi.json",
            "--checks",
            "all",
            # Not about 5xx or undocumented statuses: schema-valid input refused by rules a
            # schema cannot state (an unknown time zone, a period not yet begun, an id that
            # does not exist), and pydantic's lax coercion accepting `false` for 0 or a number
            # of epoch seconds for a time.
            "--exclude-checks",
            "positive_data_acceptance,negative_data_rejection",
            "--max-examples",
            os.environ.get("GPUMETER_SCHEMATHESIS_EXAMPLES", str(EXAMPLES_PER_OPERATION[kind])),
            "--phases",
            phases,
            *operations,
            "--generation-deterministic",
            "--no-shrink",
            # One worker: CPython 3.11 builds ASTs with a per-interpreter recursion counter that
            # threads corrupt, so hypothesis crashed with "SystemError: AST constructor
            # recursion depth mismatch" inside schemathesis's worker threads (twice in CI runs).
            "--workers",
            "1",
            # It would revoke the very key it runs with (revocation has its own tests).
            "--exclude-path",
            "/v1/keys/{key_id}/revoke",
            "--header",
            f"Authorization: Bearer {key}",
            "--report-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "NO_COLOR": "1"},
        cwd=tmp_path,  # its caches stay out of the repository
    )
    assert result.returncode == 0, result.stdout[-12000:] + result.stderr[-2000:]
