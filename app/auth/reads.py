"""Auth's read interface: the API keys listed, as the API and the command line list them.

The rest of ``app.auth.repository`` is private to the package.
"""

from __future__ import annotations

import uuid

from sqlalchemy import Select, select

from app.auth.models import ApiKey, KeyKind


def keys_query(
    *, kind: KeyKind | None = None, customer_id: uuid.UUID | None = None
) -> Select[ApiKey]:
    query = select(ApiKey).order_by(ApiKey.created_at, ApiKey.id)
    if kind is not None:
        query = query.where(ApiKey.kind == kind)
    if customer_id is not None:
        query = query.where(ApiKey.customer_id == customer_id)
    return query
