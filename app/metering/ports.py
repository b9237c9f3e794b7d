"""What ingest needs from the fleet, as an interface the fleet implements.

Metering sits below the fleet (it stores telemetry facts; the fleet owns the ``gpus`` table),
so it cannot import the fleet. Ingest registers a GPU on its node's first report and records
each GPU's latest state through this port; ``app.fleet.service.IngestGpus`` implements it,
and the composition root (``app.main.create_app``) hands it to the ingest endpoint.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Iterable
from typing import NamedTuple, Protocol

from sqlalchemy.orm import Session

# (GPU, state before, state now, epoch second seen) for each GPU whose state changed.
StateChange = tuple[str, str | None, str, int]
# A GPU's latest report: (model, state, seen, device index, minor number).
LatestReport = tuple[str, str, int, int | None, int | None]


class Claim(NamedTuple):
    """What becomes of a node's reports of a GPU whose reports it may not simply store."""

    held: bool  # kept until an operator settles who reports the GPU; else refused
    reason: str


class GpuRegistry(Protocol):
    @property
    def hold_max(self) -> int:
        """The most items held per GPU in dispute; past it they are refused."""
        ...

    def owners(self, session: Session, gpu_uuids: Iterable[str]) -> dict[str, uuid.UUID | None]:
        """For each registered GPU, the node whose reports of it are stored; None for a GPU
        in dispute or retired (``claims`` says what becomes of any node's reports of it)."""
        ...

    def claims(
        self, session: Session, node_id: uuid.UUID, gpu_uuids: Collection[str], batch_id: str
    ) -> dict[str, Claim]:
        """The node's reports of these GPUs, registered to another node, in dispute or retired:
        whether each GPU's are held or refused. A GPU of another node enters a dispute (and a
        ``gpu.uuid_clash`` event says so). A GPU left out is the node's own after all."""
        ...

    def register(self, session: Session, node_id: uuid.UUID, models: dict[str, str]) -> None:
        """Register GPUs (uuid -> model) to the node; ones registered meanwhile stay as they are."""
        ...

    def record_latest(self, session: Session, latest: dict[str, LatestReport]) -> list[StateChange]:
        """Record each GPU's (model, state, seen, device index, minor number) unless a later
        report came first; the changes."""
        ...
