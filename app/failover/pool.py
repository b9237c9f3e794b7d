"""The hot-spare pool of one GPU model in one datacenter: what a failover may take, the
policy's target, and ``spare_pool.low`` once per crossing below it."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from sqlalchemy.orm import Session

from app.events.service import publish
from app.failover import repository
from app.failover.models import Failover
from app.fleet import service as fleet
from app.fleet.models import Pool
from app.fleet.schemas import SiteGpu

FAILED = "failed"


def available(gpu: SiteGpu, reserved: dict[str, Failover]) -> bool:
    """A spare a failover may take: in the spare pool, not failed, not reserved, not booked
    for later (the job could not stay), and idle or held by a preemptible rental (which the
    failover then preempts)."""
    return (
        gpu.pool == Pool.SPARE
        and gpu.last_state != FAILED
        and gpu.uuid not in reserved
        and gpu.booked_from is None
        and (gpu.rental_id is None or bool(gpu.rental_preemptible))
    )


@dataclass(frozen=True)
class _Policy:
    target_percent: Decimal
    min_count: int


def _policy_of(session: Session, datacenter: str, model: str, default_target: Decimal) -> _Policy:
    row = repository.policy(session, datacenter, model)
    if row is None:
        return _Policy(default_target, 0)
    return _Policy(row.target_percent, row.min_count)


def pool_counts(
    session: Session, datacenter: str, model: str, default_target: Decimal
) -> dict[str, Any]:
    """The pool's counts against its policy (with no policy row, ``default_target`` percent:
    the ``spare_target_percent`` setting)."""
    site = fleet.pool_site(session, model, datacenter, datetime.now(UTC))
    reserved = repository.reservations(session, [g.uuid for g in site])
    spares = [g for g in site if g.pool == Pool.SPARE]
    free = [g for g in spares if available(g, reserved)]
    policy = _policy_of(session, datacenter, model, default_target)
    target = max(policy.min_count, math.ceil(len(site) * policy.target_percent / 100))
    return {
        "datacenter": datacenter,
        "model": model,
        "total_gpus": len(site),
        "spare_gpus": len(spares),
        "available": len(free),
        "reserved": sum(1 for g in spares if g.uuid in reserved),
        "preemptibly_rented": sum(1 for g in free if g.rental_id is not None),
        "in_use": sum(1 for g in spares if g.rental_id is not None and not g.rental_preemptible),
        "failed": sum(1 for g in spares if g.last_state == FAILED),
        "target": target,
        "target_percent": policy.target_percent,
        "min_count": policy.min_count,
        "below_target": len(free) < target,
        # Preemptible hours are counted on every GPU of the site: a spare a failover took has
        # left the pool, but the hours it was sold before still were.
        "site_uuids": [g.uuid for g in site],
    }


def check_pool(session: Session, datacenter: str, model: str, default_target: Decimal) -> None:
    """Publish ``spare_pool.low`` when the pool has just fallen below its target (once per
    crossing: the policy row remembers, locked while it is compared)."""
    row = repository.locked_policy(session, datacenter, model, default_target)
    counts = pool_counts(session, datacenter, model, default_target)
    low = bool(counts["below_target"])
    if low and not row.below_target:
        data = {k: v for k, v in counts.items() if k != "site_uuids"}
        publish(session, "spare_pool.low", data, subject=f"spare_pool/{datacenter}/{model}")
    row.below_target = low
    session.flush()
