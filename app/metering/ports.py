"""What ingest needs from the fleet, as an interface the fleet implements.

Metering sits below the fleet (it stores telemetry facts; the fleet owns the ``gpus`` table),
so it cannot import the fleet. Ingest registers a GPU on its node's first report and records
each GPU's latest state through this port; ``app.fleet.service.IngestGpus`` implements it,
and the composition root (``app.main.create_app``) hands it to the ingest endpoint.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Protocol

from sqlalchemy.orm import Session

# (GPU, state before, state now, epoch second seen) for each GPU whose state changed.
StateChange = tuple[str, str | None, str, int]


class GpuRegistry(Protocol):
    def owners(self, session: Session, gpu_uuids: Iterable[str]) -> dict[str, uuid.UUID]:
        """The registered node of each GPU that is registered."""
        ...

    def register(self, session: Session, node_id: uuid.UUID, models: dict[str, str]) -> None:
        """Register GPUs (uuid -> model) to the node; ones registered meanwhile stay as they are."""
        ...

    def record_latest(
        self, session: Session, latest: dict[str, tuple[str, str, int, int | None]]
    ) -> list[StateChange]:
        """Record each GPU's (model, state, seen, device index) unless a later report came
        first; the changes."""
        ...
