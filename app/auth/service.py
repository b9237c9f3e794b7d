"""API keys: random secrets shown once, stored as SHA-256 digests, revocable."""

from __future__ import annotations

import hashlib
import secrets
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import Engine, Select
from sqlalchemy.orm import Session

from app.auth import cache, reads, repository
from app.auth.models import ApiKey, KeyKind
from app.auth.principal import Principal as Principal  # callers import it from here
from app.core.errors import Conflict, not_found

PREFIX_LENGTH = 12


@dataclass(frozen=True)
class IssuedKey:
    key: ApiKey
    secret: str  # the only time the clear key exists


def hash_secret(secret: str) -> str:
    # Keys are 256-bit random, so a fast digest is safe here (no dictionary to attack).
    return hashlib.sha256(secret.encode()).hexdigest()


def issue_key(
    session: Session,
    kind: KeyKind,
    name: str,
    *,
    customer_id: uuid.UUID | None = None,
    node_id: uuid.UUID | None = None,
) -> IssuedKey:
    secret = f"gm_{kind.value}_{secrets.token_urlsafe(32)}"
    key = ApiKey(
        kind=kind,
        name=name,
        prefix=secret[:PREFIX_LENGTH],
        key_hash=hash_secret(secret),
        customer_id=customer_id,
        node_id=node_id,
    )
    session.add(key)
    session.flush()
    return IssuedKey(key=key, secret=secret)


def authenticate(session: Session, secret: str) -> Principal | None:
    """The key's principal, None for an unknown or revoked key (cached: see ``cache``)."""
    return cache.for_session(session).get(session, hash_secret(secret))


def authenticate_cached(engine: Engine, secret: str) -> Principal | None:
    """The key's principal if this process holds it and needs no database to trust it."""
    return cache.for_engine(engine).lookup(hash_secret(secret))


def key_active(session: Session, key_id: uuid.UUID) -> bool:
    """Read interface: whether the key exists and is not revoked (read now, not cached)."""
    key = session.get(ApiKey, key_id)
    return key is not None and key.revoked_at is None


def sign_out_session(session: Session, session_id: uuid.UUID, expires_at: int) -> None:
    """End a dashboard session on the server: its cookie is refused from now on, wherever a
    copy of it is (kept until it would have expired anyway)."""
    now = datetime.now(UTC)
    repository.record_sign_out(session, session_id, datetime.fromtimestamp(expires_at, UTC), now)


def session_signed_out(session: Session, session_id: uuid.UUID) -> bool:
    """Read interface: whether the dashboard session was signed out of."""
    return repository.signed_out(session, session_id)


def customer_keys_query(customer_id: uuid.UUID) -> Select[ApiKey]:
    """The customer's API keys (revoked ones too), oldest first."""
    return reads.keys_query(kind=KeyKind.CUSTOMER, customer_id=customer_id)


def get_key(session: Session, key_id: uuid.UUID) -> ApiKey:
    key = session.get(ApiKey, key_id)
    if key is None:
        raise not_found("API key", key_id)
    return key


def revoke_key(session: Session, key_id: uuid.UUID) -> ApiKey:
    key = get_key(session, key_id)
    if key.revoked_at is None:
        if key.kind == KeyKind.ADMIN and repository.lock_active_admin_keys(session) == [key.id]:
            raise Conflict(
                f"API key {key_id} is the last active admin key; create another admin key "
                "before revoking this one",
                ("path", "key_id"),
            )
        key.revoked_at = datetime.now(UTC)
        cache.for_session(session).forget([key.key_hash])
    return key


def revoke_node_keys(session: Session, node_id: uuid.UUID) -> None:
    now = datetime.now(UTC)
    keys = repository.active_keys(session, node_id=node_id)
    for key in keys:
        key.revoked_at = now
    cache.for_session(session).forget(key.key_hash for key in keys)
