from __future__ import annotations

import uuid
from datetime import datetime

from app.auth.models import KeyKind
from app.core.schemas import Name, Schema


class KeyCreate(Schema):
    name: Name


class KeyRead(Schema):
    id: uuid.UUID
    kind: KeyKind
    name: str
    prefix: str
    customer_id: uuid.UUID | None
    node_id: uuid.UUID | None
    created_at: datetime
    revoked_at: datetime | None


class IssuedKeyRead(KeyRead):
    key: str  # shown once; only its digest is stored
