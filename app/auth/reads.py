"""Auth's read interface: the API keys listed, as the API and the command line list them.

The rest of ``app.auth.repository`` is private to the package.
"""

from __future__ import annotations

import uuid

from sqlalchemy import Select, select

from app.auth.models import ApiKey, KeyKind
from app.core.pagination import where_given


def keys_query(
    *, kind: KeyKind | None = None, customer_id: uuid.UUID | None = None
) -> Select[ApiKey]:
    query = select(ApiKey).order_by(ApiKey.created_at, ApiKey.id)
    return where_given(query, (ApiKey.kind, kind), (ApiKey.customer_id, customer_id))
