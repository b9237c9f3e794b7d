"""The orchestrator's side of simulated failures: move each hit rental to a spare GPU.

With ``auto`` recovery the rental resumes on a spare within seconds (a scheduler watching fleet
health); with ``manual`` after the minutes a human process takes (``manual_recovery_s``).
Migrations are recorded by the rentals service, exactly as ``POST /v1/rentals/{id}/migrations``
does, so its checks (the GPU is free, same model, within the rental) hold for simulated data too.
"""

from __future__ import annotations

import random
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from sqlalchemy.orm import Session

from app.core.epoch import epoch, from_epoch
from app.fleet import reads as fleet_reads
from app.rentals import service as rentals
from app.rentals.models import Rental
from app.rentals.reads import served
from app.rentals.schemas import MigrationCreate
from app.simulate.history import Failure, SimGpu

FOREVER = 2**62
AUTO_WINDOW_S = (15, 90)


class Recovery(StrEnum):
    AUTO = "auto"
    MANUAL = "manual"


@dataclass(slots=True)
class Held:
    """An assignment as plain epoch seconds (``end`` FOREVER while open)."""

    rental_id: uuid.UUID
    start: int
    end: int


@dataclass(slots=True)
class Ledger:
    """Who holds which GPU when, kept in step with the migrations recorded."""

    held: dict[str, list[Held]] = field(default_factory=lambda: defaultdict(list))

    def holder(self, gpu: str, at: int) -> Held | None:
        return next((h for h in self.held[gpu] if h.start < at < h.end), None)

    def free(self, gpu: str, start: int, end: int) -> bool:
        return all(h.end <= start or h.start >= end for h in self.held[gpu])


def epoch_or_forever(moment: datetime | None) -> int:
    return FOREVER if moment is None else epoch(moment)


def load_ledger(session: Session, gpu_uuids: list[str], start: int) -> Ledger:
    ledger = Ledger()
    rows = session.execute(served(gpu_uuids=gpu_uuids, start=from_epoch(start)))
    for rental_id, _customer_id, gpu_uuid, start_at, end_at in rows:
        ledger.held[gpu_uuid].append(Held(rental_id, epoch(start_at), epoch_or_forever(end_at)))
    return ledger


def resume_delay(
    recovery: Recovery,
    manual_s: int,
    rng: random.Random,
    auto_window_s: tuple[int, int] = AUTO_WINDOW_S,
) -> int:
    if recovery == Recovery.AUTO:
        return rng.randint(*auto_window_s)
    return round(manual_s * rng.uniform(0.8, 1.2))


def migrate_failures(
    session: Session,
    gpus: list[SimGpu],
    failures: list[Failure],
    window_end: int,
    delays: list[int],
    ledger: Ledger,
) -> int:
    """Migrate every rental a failure hits to a free spare (or a repaired GPU) of its model.

    ``delays[i]`` is how long failure ``i``'s rental waits; ``ledger`` follows the moves.
    Returns the migrations recorded.
    """
    model = {g.uuid: g.model for g in gpus}
    pool = fleet_reads.spare_uuids(session, list(model))
    down: dict[str, list[Failure]] = defaultdict(list)
    for f in failures:
        down[f.gpu_uuid].append(f)
    migrated = 0
    # One object per rental: ``rentals.migrate`` expires its relationships, and fetching it
    # again would reload every assignment of a 3,000-GPU rental per failure.
    rental_of: dict[uuid.UUID, Rental] = {}
    for f, delay in zip(failures, delays, strict=True):
        held, resumed = ledger.holder(f.gpu_uuid, f.at), f.at + delay
        if held is None or resumed >= min(held.end, window_end):
            continue
        target = _spare(ledger, pool, down, model, f.gpu_uuid, resumed, held.end)
        if target is None:
            continue  # no spare: the rental waits for the repair, credited as failure
        if held.rental_id not in rental_of:
            rental_of[held.rental_id] = rentals.rental_by_id(session, held.rental_id)
        rentals.migrate(
            session,
            rental_of[held.rental_id],
            MigrationCreate(
                from_gpu_uuid=f.gpu_uuid,
                to_gpu_uuid=target,
                failed_at=from_epoch(f.at),
                resumed_at=from_epoch(resumed),
                reason=f"XID {f.xid} on {f.gpu_uuid}",
            ),
        )
        ledger.held[target].append(Held(held.rental_id, resumed, held.end))
        held.end = f.at
        pool.add(f.gpu_uuid)  # once repaired, the failed GPU serves as a spare
        migrated += 1
    return migrated


def _spare(
    ledger: Ledger,
    pool: set[str],
    down: dict[str, list[Failure]],
    model: dict[str, str],
    failed: str,
    start: int,
    end: int,
) -> str | None:
    for gpu in sorted(pool):
        if gpu == failed or model[gpu] != model[failed] or not ledger.free(gpu, start, end):
            continue
        if not any(f.at <= start < f.repaired_at for f in down[gpu]):
            return gpu
    return None
