from __future__ import annotations

import uuid

from sqlalchemy.orm import Session

from app.auth.service import Principal
from app.core.errors import not_found
from app.customers import repository
from app.customers.models import Customer
from app.customers.schemas import CustomerCreate, CustomerUpdate


def get_customer(session: Session, customer_id: uuid.UUID, principal: Principal) -> Customer:
    """The customer, if the caller may see it; 404 otherwise, so existence never leaks."""
    query = repository.readable_customers(principal).where(Customer.id == customer_id)
    customer = session.scalar(query)
    if customer is None:
        raise not_found("customer", customer_id)
    return customer


def create_customer(session: Session, data: CustomerCreate) -> Customer:
    customer = Customer(**data.model_dump())
    session.add(customer)
    session.flush()
    return customer


def update_customer(session: Session, customer: Customer, data: CustomerUpdate) -> Customer:
    for field, value in data.model_dump(exclude_unset=True).items():
        setattr(customer, field, value)
    session.flush()
    return customer
