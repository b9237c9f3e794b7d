"""Human progress lines on stderr for long-running commands (logs stay JSON)."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO


class Progress:
    """Prints ``name ... done (1.2 s)`` per step, and percentages for counted work."""

    def __init__(self, stream: TextIO | None = None, *, quiet: bool = False) -> None:
        self.stream = stream or sys.stderr
        self.quiet = quiet
        self.started = time.monotonic()

    def say(self, message: str) -> None:
        if not self.quiet:
            print(message, file=self.stream, flush=True)

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        began = time.monotonic()
        self.say(f"- {name} ...")
        yield
        self.say(f"  {name}: done ({time.monotonic() - began:.1f} s)")

    def counter(self, name: str, total: int, every_percent: int = 10) -> Counter:
        return Counter(self, name, total, every_percent)

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started


class Counter:
    """Reports ``name: 40 % (n of total)`` each time another ``every_percent`` is done."""

    def __init__(self, progress: Progress, name: str, total: int, every_percent: int) -> None:
        self.progress, self.name, self.total = progress, name, max(total, 1)
        self.every = every_percent
        self.done = 0
        self._next = every_percent

    def add(self, n: int = 1) -> None:
        self.done += n
        percent = self.done * 100 // self.total
        if percent >= self._next:
            self.progress.say(f"  {self.name}: {percent} % ({self.done:,} of {self.total:,})")
            self._next = (percent // self.every + 1) * self.every
