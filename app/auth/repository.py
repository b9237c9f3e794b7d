from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import delete, exists, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from app.auth.models import ApiKey, KeyKind, SignedOutSession


def active_key_by_hash(session: Session, key_hash: str) -> ApiKey | None:
    return session.scalar(
        select(ApiKey).where(ApiKey.key_hash == key_hash, ApiKey.revoked_at.is_(None))
    )


def active_digests(session: Session, digests: Sequence[str]) -> set[str]:
    """Which of these key digests belong to keys that exist and are not revoked."""
    return set(
        session.scalars(
            select(ApiKey.key_hash).where(ApiKey.key_hash.in_(digests), ApiKey.revoked_at.is_(None))
        )
    )


def active_keys(session: Session, *, node_id: uuid.UUID) -> Sequence[ApiKey]:
    return session.scalars(
        select(ApiKey).where(ApiKey.node_id == node_id, ApiKey.revoked_at.is_(None))
    ).all()


def lock_active_admin_keys(session: Session) -> list[uuid.UUID]:
    """Ids of the active admin keys, locked: two admins revoking each other's key at once
    cannot both succeed and leave none."""
    return list(
        session.scalars(
            select(ApiKey.id)
            .where(ApiKey.kind == KeyKind.ADMIN, ApiKey.revoked_at.is_(None))
            .order_by(ApiKey.id)
            .with_for_update()
        )
    )


def record_sign_out(
    session: Session, session_id: uuid.UUID, expires_at: datetime, now: datetime
) -> None:
    """Refuse the session from now on; forget the sign-outs whose sessions have expired."""
    session.execute(delete(SignedOutSession).where(SignedOutSession.expires_at <= now))
    statement = insert(SignedOutSession).values(session_id=session_id, expires_at=expires_at)
    session.execute(statement.on_conflict_do_nothing())


def signed_out(session: Session, session_id: uuid.UUID) -> bool:
    return bool(session.scalar(select(exists().where(SignedOutSession.session_id == session_id))))
