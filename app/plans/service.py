from __future__ import annotations

import uuid
from datetime import datetime
from decimal import Decimal

from sqlalchemy import Select, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.auth.service import Principal
from app.core.errors import Conflict, Unprocessable, not_found
from app.customers.service import customer_by_id
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


def create_plan(session: Session, data: PlanCreate) -> PricePlan:
    plan = PricePlan(
        **data.model_dump(exclude={"prices", "voucher_tiers"}),
        voucher_tiers=[tier.model_dump(mode="json") for tier in data.voucher_tiers],
    )
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
        setattr(plan, field, changes[field] if field == "voucher_tiers" else getattr(data, field))
    session.flush()
    return plan


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
