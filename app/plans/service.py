from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from sqlalchemy import Select, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.auth.service import Principal
from app.core.errors import Conflict, Unprocessable, not_found
from app.customers.service import customer_by_id
from app.metering.causes import DegradedCause
from app.plans import repository
from app.plans.models import PlanPrice, PricePlan
from app.plans.schemas import PlanCreate, PlanUpdate, PriceCreate, PriceRead
from app.rentals.ports import Plans, RentalPlan


def get_plan(session: Session, plan_id: uuid.UUID, principal: Principal) -> PricePlan:
    plan = session.scalar(repository.readable_plans(principal).where(PricePlan.id == plan_id))
    if plan is None:
        raise not_found("price plan", plan_id)
    return plan


def visible_prices_query(plan: PricePlan, principal: Principal) -> Select[PlanPrice]:
    """The plan's prices this caller may see: never another customer's contract."""
    return repository.readable_prices(principal, plan.id)


def visible_prices(session: Session, plan: PricePlan, principal: Principal) -> list[PriceRead]:
    query = visible_prices_query(plan, principal)
    return [PriceRead.model_validate(price) for price in session.scalars(query)]


# Stored as JSONB: written as their JSON form.
_JSON_FIELDS = {"voucher_tiers", "migrate_degraded_causes"}


def create_plan(session: Session, data: PlanCreate) -> PricePlan:
    plan = PricePlan(
        **data.model_dump(exclude={"prices", *_JSON_FIELDS}),
        **data.model_dump(include=_JSON_FIELDS, mode="json"),
    )
    _require_causes(plan)
    session.add(plan)
    try:
        session.flush()
    except IntegrityError:
        raise Conflict(
            f"a price plan named {data.name!r} already exists", ("body", "name")
        ) from None
    for index, price in enumerate(data.prices):
        add_price(session, plan, price, loc=("body", "prices", index))
    session.refresh(plan)
    return plan


def update_plan(session: Session, plan: PricePlan, data: PlanUpdate) -> PricePlan:
    changes = data.model_dump(exclude_unset=True, mode="json")
    if "name" in changes:
        holder = session.scalar(select(PricePlan.id).where(PricePlan.name == data.name))
        if holder is not None and holder != plan.id:
            raise Conflict(f"price plan {holder} is already named {data.name!r}", ("body", "name"))
    for field in changes:
        setattr(plan, field, changes[field] if field in _JSON_FIELDS else getattr(data, field))
    _require_causes(plan)
    session.flush()
    return plan


def _require_causes(plan: PricePlan) -> None:
    """A spare policy for degraded GPUs names the causes it moves them for (none would never
    move one, which a plan says with ``migrate_degraded_after_s: null``)."""
    if plan.migrate_degraded_after_s is not None and not plan.migrate_degraded_causes:
        raise Unprocessable(
            "migrate_degraded_after_s needs migrate_degraded_causes: the degraded causes "
            f"that move a GPU, some of {sorted(c.value for c in DegradedCause)}",
            ("body", "migrate_degraded_causes"),
        )


def add_price(
    session: Session, plan: PricePlan, data: PriceCreate, loc: tuple[str | int, ...] = ("body",)
) -> PlanPrice:
    if data.customer_id is not None and customer_by_id(session, data.customer_id) is None:
        raise Unprocessable(f"customer {data.customer_id} does not exist", (*loc, "customer_id"))
    price = PlanPrice(plan_id=plan.id, **data.model_dump())
    try:
        with session.begin_nested():
            session.add(price)
            session.flush()
    except IntegrityError:
        raise Conflict(
            f"plan {plan.name!r} already has a {data.gpu_model} price effective from "
            f"{data.effective_from.isoformat()} for this customer scope",
            (*loc, "effective_from"),
        ) from None
    session.expire(plan, ["prices"])
    return price


def price_schedule(
    session: Session,
    plan_id: uuid.UUID,
    gpu_model: str,
    customer_id: uuid.UUID,
    *,
    preemptible: bool = False,
) -> list[tuple[datetime, Decimal, Decimal | None]]:
    """Effective-dated (from, price, monthly cap per GPU) of one model for one customer,
    ascending.

    A contract override applies from its effective time on and wins over base prices from
    then on; before the first override, base prices apply. ``preemptible``: the preemptible
    prices of those rows (no cap: a preemptible rental is already the cheap way), and only
    rows that set one, so a later row without one keeps the earlier preemptible price.
    """
    rows = session.scalars(
        repository.prices_query(plan_id, customer_id=customer_id, model=gpu_model)
    ).all()
    first_override = min(
        (p.effective_from for p in rows if p.customer_id is not None), default=None
    )
    applying = [
        p
        for p in rows
        if (p.customer_id is not None)
        or first_override is None
        or p.effective_from < first_override
    ]
    schedule: list[tuple[datetime, Decimal, Decimal | None]]
    if preemptible:
        schedule = [
            (p.effective_from, p.preemptible_price_per_hour, None)
            for p in applying
            if p.preemptible_price_per_hour is not None
        ]
    else:
        schedule = [(p.effective_from, p.price_per_hour, p.monthly_cap_per_gpu) for p in applying]
    return sorted(schedule, key=lambda point: point[0])


def price_rows(session: Session, plan_id: uuid.UUID, customer_id: uuid.UUID) -> list[PlanPrice]:
    """Read interface (cost exports): the plan's published prices and the customer's own, with
    their ids (a price list's entries, as ``GET /v1/plans/{id}/prices`` shows them)."""
    return list(session.scalars(repository.prices_query(plan_id, customer_id=customer_id)))


def prices_added_since(
    session: Session, customer_id: uuid.UUID, before: datetime, since: datetime
) -> bool:
    """Whether a price effective before ``before`` was added after ``since`` to a plan the
    customer rents on (base or its own contract price): billing re-rates finalized periods."""
    return repository.prices_added_since(session, customer_id, before, since)


class _RentalPlans:
    """The plans' answers to rentals (app.rentals.ports.Plans)."""

    def plan(self, session: Session, plan_id: uuid.UUID) -> RentalPlan | None:
        plan = session.get(PricePlan, plan_id)
        return None if plan is None else RentalPlan(plan.name, plan.currency)

    def has_price(
        self,
        session: Session,
        plan_id: uuid.UUID,
        gpu_model: str,
        customer_id: uuid.UUID,
        *,
        preemptible: bool,
    ) -> bool:
        return bool(
            price_schedule(session, plan_id, gpu_model, customer_id, preemptible=preemptible)
        )


RENTAL_PLANS: Plans = _RentalPlans()


@dataclass(frozen=True)
class DegradedPolicy:
    """A plan's spare policy for degraded GPUs: migrate after ``after_s`` of these causes."""

    after_s: int
    causes: frozenset[DegradedCause]


def degraded_policies(session: Session) -> dict[uuid.UUID, DegradedPolicy]:
    """Read interface (failover): each plan that migrates degraded GPUs, with its policy."""
    return {
        plan.id: DegradedPolicy(
            plan.migrate_degraded_after_s,
            frozenset(DegradedCause(c) for c in plan.migrate_degraded_causes),
        )
        for plan in repository.degraded_migrating_plans(session)
        if plan.migrate_degraded_after_s is not None
    }
