from __future__ import annotations

import uuid
from datetime import datetime
from enum import StrEnum

from sqlalchemy import CheckConstraint, ForeignKey, String
from sqlalchemy.orm import Mapped, mapped_column

from app.core.base import Base, Timestamped, pg_enum

KEY_NAME_LENGTH = 200  # the longest key name the column holds


class KeyKind(StrEnum):
    ADMIN = "admin"  # operator: everything
    CUSTOMER = "customer"  # reads its own customer's data only
    NODE = "node"  # agent token: reports telemetry for its own node's GPUs only
    SCHEDULER = "scheduler"  # a scheduler adapter: job snapshots and failover outcomes only


class ApiKey(Timestamped, Base):
    __tablename__ = "api_keys"
    __table_args__ = (
        CheckConstraint(
            "(kind = 'customer') = (customer_id IS NOT NULL)"
            " AND (kind = 'node') = (node_id IS NOT NULL)",
            name="owner_matches_kind",
        ),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    kind: Mapped[KeyKind] = mapped_column(pg_enum(KeyKind, "key_kind"))
    name: Mapped[str] = mapped_column(String(KEY_NAME_LENGTH))
    # The first characters of the key, kept in clear so an operator can tell keys apart.
    prefix: Mapped[str] = mapped_column(String(16))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    customer_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("customers.id", ondelete="CASCADE"), index=True
    )
    node_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("nodes.id", ondelete="CASCADE"), index=True
    )
    revoked_at: Mapped[datetime | None]


class SignedOutSession(Base):
    """A dashboard session its holder signed out of: refused until it would have expired
    anyway (``expires_at``), then forgotten, so the table holds at most a session lifetime's
    sign-outs."""

    __tablename__ = "signed_out_sessions"

    session_id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    expires_at: Mapped[datetime] = mapped_column(index=True)
