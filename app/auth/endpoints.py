from __future__ import annotations

import uuid

from fastapi import APIRouter

from app.auth import reads, service
from app.auth.deps import Admin
from app.auth.models import KeyKind
from app.auth.schemas import IssuedKeyRead, KeyCreate, KeyRead
from app.core.deps import DbSession
from app.core.errors import error_responses
from app.core.pagination import Page, Paging, paginate

router = APIRouter(prefix="/v1/keys", tags=["api keys"])


def issued_key_read(issued: service.IssuedKey) -> IssuedKeyRead:
    return IssuedKeyRead(**KeyRead.model_validate(issued.key).model_dump(), key=issued.secret)


@router.post("", status_code=201)
def create_admin_key(body: KeyCreate, session: DbSession, _: Admin) -> IssuedKeyRead:
    """Create an operator (admin) key. Customer keys and node tokens have their own routes."""
    return issued_key_read(service.issue_key(session, KeyKind.ADMIN, body.name))


@router.post("/scheduler", status_code=201)
def create_scheduler_key(body: KeyCreate, session: DbSession, _: Admin) -> IssuedKeyRead:
    """Create a key for a scheduler adapter (``gpumeter-slurm``): it may post job snapshots,
    read and complete its cluster's actions and report their failovers' outcomes, nothing
    else (no customers, prices, invoices or keys)."""
    return issued_key_read(service.issue_key(session, KeyKind.SCHEDULER, body.name))


@router.get("")
def list_keys(
    session: DbSession, _: Admin, page: Paging, kind: KeyKind | None = None
) -> Page[KeyRead]:
    return paginate(session, reads.keys_query(kind=kind), page, KeyRead)


@router.post("/{key_id}/revoke", responses=error_responses(404, 409))
def revoke_key(key_id: uuid.UUID, session: DbSession, _: Admin) -> KeyRead:
    """Revoke a key at once. The last active admin key cannot be revoked (409)."""
    return KeyRead.model_validate(service.revoke_key(session, key_id))
