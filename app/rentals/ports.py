"""What rentals ask of the GPUs and plans they reference.

The fleet and plans sit above rentals: their lists are scoped by rentals' visibility (the GPUs
that served a customer, the plans it rents on), so rentals cannot import them. They implement
these ports instead (``app.fleet.service.RENTAL_GPUS``, ``app.plans.service.RENTAL_PLANS``),
and the composition root hands them to ``app.rentals.service.use_catalogue`` (``app.wiring``;
the simulator for its own runs).
"""

from __future__ import annotations

import uuid
from collections.abc import Collection
from dataclasses import dataclass
from typing import Protocol

from sqlalchemy.orm import Session


@dataclass(frozen=True)
class RentalGpu:
    """What an assignment checks of its GPU."""

    uuid: str
    model: str
    in_maintenance: bool
    in_quarantine: bool  # reported by its node, not yet admitted by an operator


@dataclass(frozen=True)
class RentalPlan:
    """What a new rental checks of its plan."""

    name: str
    currency: str


class Gpus(Protocol):
    def lock(self, session: Session, gpu_uuids: Collection[str]) -> dict[str, RentalGpu]:
        """The GPUs by UUID, their rows locked for the transaction (in UUID order), so
        concurrent assignments of one GPU are checked one after the other; a UUID no GPU has
        is absent."""


class Plans(Protocol):
    def plan(self, session: Session, plan_id: uuid.UUID) -> RentalPlan | None: ...

    def has_price(
        self,
        session: Session,
        plan_id: uuid.UUID,
        gpu_model: str,
        customer_id: uuid.UUID,
        *,
        preemptible: bool,
    ) -> bool:
        """Whether the plan prices the model for the customer (preemptible prices if so)."""


@dataclass(frozen=True)
class Catalogue:
    gpus: Gpus
    plans: Plans
