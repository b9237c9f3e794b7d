"""The tenancy rule as a SQL condition, for the repositories' ``readable_*`` statements."""

from __future__ import annotations

import uuid

from sqlalchemy import ColumnElement, false, true
from sqlalchemy.orm import InstrumentedAttribute

from app.auth.service import Principal


def readable_by(
    principal: Principal, customer_id: InstrumentedAttribute[uuid.UUID | None]
) -> ColumnElement[bool]:
    """Rows of every customer for an admin, of its own customer for a customer key, and none
    for any other key: a node key has no customer, and reading "no scope" as "everything"
    would show it every customer's data."""
    if principal.is_admin:
        return true()
    if principal.customer_id is None:
        return false()
    return customer_id == principal.customer_id
