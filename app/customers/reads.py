"""Customers' read interface: the customers a principal may read, listed, and their names.

Every query on customers lives here: the package has no private repository.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection

from sqlalchemy import Select, select

from app.auth.service import Principal
from app.customers.models import Customer


def readable_customers(principal: Principal) -> Select[Customer]:
    """Every customer the principal may read (all for an admin, its own for a customer key);
    every list and get of customers starts here."""
    return customers_query(only_id=principal.customer_scope)


def customers_query(*, only_id: uuid.UUID | None = None) -> Select[Customer]:
    query = select(Customer).order_by(Customer.created_at, Customer.id)
    if only_id is not None:
        query = query.where(Customer.id == only_id)
    return query


def names_query(ids: Collection[uuid.UUID]) -> Select[uuid.UUID, str]:
    """The customers' ids and names (the revenue page's per-customer rows)."""
    return select(Customer.id, Customer.name).where(Customer.id.in_(ids))
