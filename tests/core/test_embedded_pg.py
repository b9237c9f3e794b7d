"""The embedded Postgres's library imports quietly where XDG_RUNTIME_DIR is unset (root with no
login session: a container, CI, the demo's terminal)."""

from __future__ import annotations

import os
import subprocess
import sys


def test_importing_the_embedded_postgres_prints_no_runtime_dir_warning() -> None:
    env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
    code = "from app.core.embedded_pg import import_pgserver; import_pgserver()"
    ran = subprocess.run(
        [sys.executable, "-W", "default", "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert (ran.stdout, ran.stderr) == ("", "")
