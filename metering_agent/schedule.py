"""When an agent cuts its open records and uploads them: upload rounds every ``interval_s``.

Rounds fall at wall-clock times ``k * interval_s + offset_s``. The offset is drawn once per agent
(seeded for tests), uniformly within the interval, so a fleet started or restarted together
still uploads spread over the interval instead of in the same second; the fractional part of the
offset spreads uploads within the second too. Rounds are wall-clock aligned, not start-aligned,
so an agent keeps its place in the spread across restarts only if it keeps its seed.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class UploadSchedule:
    interval_s: float
    offset_s: float = 0.0  # within [0, interval_s)

    def __post_init__(self) -> None:
        if not self.interval_s > 0:
            raise ValueError(f"upload interval must be > 0 s, not {self.interval_s}")
        if not 0 <= self.offset_s < self.interval_s:
            raise ValueError(f"offset {self.offset_s} s must be within [0, {self.interval_s})")

    @classmethod
    def jittered(cls, interval_s: float, seed: int | None = None) -> UploadSchedule:
        """A schedule at a random offset (``seed`` None: from the OS's entropy)."""
        return cls(interval_s, random.Random(seed).uniform(0, interval_s) % interval_s)

    def first_round_from(self, t: float) -> float:
        """The first round at or after wall-clock time ``t``."""
        k = math.ceil((t - self.offset_s) / self.interval_s)
        return k * self.interval_s + self.offset_s
