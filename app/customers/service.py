from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.auth.service import Principal
from app.core.errors import Conflict, not_found
from app.customers import reads
from app.customers.models import Customer
from app.customers.schemas import CustomerCreate, CustomerUpdate


def get_customer(session: Session, customer_id: uuid.UUID, principal: Principal) -> Customer:
    """The customer, if the caller may see it; 404 otherwise, so existence never leaks."""
    query = reads.readable_customers(principal).where(Customer.id == customer_id)
    customer = session.scalar(query)
    if customer is None:
        raise not_found("customer", customer_id)
    return customer


def customer_by_id(
    session: Session, customer_id: uuid.UUID, *, for_update: bool = False
) -> Customer | None:
    """Read interface (no caller to scope by): the customer, None if there is none."""
    return session.get(Customer, customer_id, with_for_update=for_update)


def existing_customer(
    session: Session, customer_id: uuid.UUID, *, for_update: bool = False
) -> Customer:
    """Read interface: a customer a row of the caller refers to (a foreign key keeps it)."""
    return session.get_one(Customer, customer_id, with_for_update=for_update)


def customers_by_zone(
    session: Session, only_id: uuid.UUID | None = None, zone: str | None = None
) -> list[Customer]:
    """Read interface (invoice runs): every customer (or only ``only_id``, or only those billed
    in ``zone``), by billing zone."""
    query = select(Customer).order_by(Customer.billing_timezone, Customer.id)
    if only_id is not None:
        query = query.where(Customer.id == only_id)
    if zone is not None:
        query = query.where(Customer.billing_timezone == zone)
    return list(session.scalars(query))


def billing_zones(session: Session) -> list[str]:
    """Read interface (schedule): every billing time zone some customer has."""
    return list(session.scalars(select(Customer.billing_timezone).distinct()))


def customer_ids(session: Session) -> list[uuid.UUID]:
    """Read interface (schedule): every customer's id."""
    return list(session.scalars(select(Customer.id).order_by(Customer.id)))


# What runs when a customer is created, registered by the composition root (app.wiring): e.g.
# the balances package's trial credit, which sits above customers and so cannot be called here.
CreatedHook = Callable[[Session, Customer], None]
_created_hooks: list[CreatedHook] = []


def add_created_hook(hook: CreatedHook) -> None:
    """Run ``hook`` in the transaction of every customer's creation; idempotent."""
    if hook not in _created_hooks:
        _created_hooks.append(hook)


def create_customer(session: Session, data: CustomerCreate) -> Customer:
    _check_stripe_id_free(session, data.stripe_customer_id, None)
    customer = Customer(**data.model_dump())
    session.add(customer)
    session.flush()
    for hook in _created_hooks:
        hook(session, customer)
    return customer


def update_customer(session: Session, customer: Customer, data: CustomerUpdate) -> Customer:
    changes = data.model_dump(exclude_unset=True)
    if "stripe_customer_id" in changes:
        _check_stripe_id_free(session, changes["stripe_customer_id"], customer.id)
    for field, value in changes.items():
        setattr(customer, field, value)
    session.flush()
    return customer


def _check_stripe_id_free(
    session: Session, stripe_id: str | None, customer_id: uuid.UUID | None
) -> None:
    """One Stripe customer per customer: another's id is a 409 naming the holder. (The unique
    index still guards concurrent writers.)"""
    if stripe_id is None:
        return
    holder = session.scalar(select(Customer.id).where(Customer.stripe_customer_id == stripe_id))
    if holder is not None and holder != customer_id:
        raise Conflict(
            f"Stripe customer {stripe_id} already belongs to customer {holder}",
            ("body", "stripe_customer_id"),
        )


def revoke_portal_sessions(session: Session, customer: Customer) -> datetime:
    """Mark every portal link and dashboard session of the customer issued until now revoked."""
    customer.portal_revoked_at = datetime.now(UTC)
    session.flush()
    return customer.portal_revoked_at


def portal_revoked_at(session: Session, customer_id: uuid.UUID) -> datetime | None:
    return session.scalar(select(Customer.portal_revoked_at).where(Customer.id == customer_id))
