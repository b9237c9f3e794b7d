"""Who is calling: the principal a key (or a dashboard session) stands for."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from app.auth.models import KeyKind


@dataclass(frozen=True)
class Principal:
    """Who is calling: the key's kind and, for customer and node keys, whose it is."""

    key_id: uuid.UUID
    kind: KeyKind
    customer_id: uuid.UUID | None = None
    node_id: uuid.UUID | None = None

    @property
    def is_admin(self) -> bool:
        return self.kind == KeyKind.ADMIN

    @property
    def customer_scope(self) -> uuid.UUID | None:
        """The only customer whose data this caller may read; None for an admin (all)."""
        return None if self.is_admin else self.customer_id

    @property
    def tenant(self) -> str:
        """Whose namespace the caller's idempotency keys live in: its customer's, its node's,
        or (every admin key) the operator's."""
        if self.is_admin:
            return "admin"
        return f"customer:{self.customer_id}" if self.customer_id else f"node:{self.node_id}"
