"""A progress bar on stderr for long jobs (the invoice run, the benchmark); no dependency."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class ProgressBar:
    """Call with (done, total); redraws at most every ``interval`` seconds and at the end."""

    def __init__(
        self, unit: str, stream: TextIO | None = None, width: int = 30, interval: float = 0.1
    ) -> None:
        self.unit, self.stream, self.width, self.interval = (
            unit,
            stream or sys.stderr,
            width,
            interval,
        )
        self._drawn_at = 0.0

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if done < total and now - self._drawn_at < self.interval:
            return
        self._drawn_at = now
        filled = self.width * done // max(total, 1)
        bar = "#" * filled + "-" * (self.width - filled)
        end = "\n" if done >= total else ""
        self.stream.write(f"\r[{bar}] {done:,}/{total:,} {self.unit}{end}")
        self.stream.flush()
