from __future__ import annotations

import uuid

from sqlalchemy import Select, select

from app.customers.models import Customer


def customers_query(*, only_id: uuid.UUID | None = None) -> Select[Customer]:
    query = select(Customer).order_by(Customer.created_at, Customer.id)
    if only_id is not None:
        query = query.where(Customer.id == only_id)
    return query
