from __future__ import annotations

import uuid

from fastapi import APIRouter

from app.auth import service as key_service
from app.auth.deps import Admin, ConsoleUser
from app.auth.endpoints import issued_key_read
from app.auth.models import KeyKind
from app.auth.schemas import IssuedKeyRead, KeyCreate, KeyRead
from app.core.deps import DbSession
from app.core.pagination import Page, Paging, paginate
from app.customers import reads, service
from app.customers.schemas import CustomerCreate, CustomerRead, CustomerUpdate

router = APIRouter(prefix="/v1/customers", tags=["customers"])


@router.post("", status_code=201)
def create_customer(body: CustomerCreate, session: DbSession, _: Admin) -> CustomerRead:
    return CustomerRead.model_validate(service.create_customer(session, body))


@router.get("")
def list_customers(session: DbSession, caller: ConsoleUser, page: Paging) -> Page[CustomerRead]:
    """Admins see every customer; a customer key sees only its own."""
    query = reads.readable_customers(caller)
    return paginate(session, query, page, CustomerRead)


@router.get("/{customer_id}")
def read_customer(customer_id: uuid.UUID, session: DbSession, caller: ConsoleUser) -> CustomerRead:
    return CustomerRead.model_validate(service.get_customer(session, customer_id, caller))


@router.patch("/{customer_id}")
def update_customer(
    customer_id: uuid.UUID, body: CustomerUpdate, session: DbSession, admin: Admin
) -> CustomerRead:
    customer = service.get_customer(session, customer_id, admin)
    return CustomerRead.model_validate(service.update_customer(session, customer, body))


@router.post("/{customer_id}/keys", status_code=201)
def create_customer_key(
    customer_id: uuid.UUID, body: KeyCreate, session: DbSession, admin: Admin
) -> IssuedKeyRead:
    """Issue an API key for the customer's own use; the key is shown once."""
    service.get_customer(session, customer_id, admin)
    issued = key_service.issue_key(session, KeyKind.CUSTOMER, body.name, customer_id=customer_id)
    return issued_key_read(issued)


@router.get("/{customer_id}/keys")
def list_customer_keys(
    customer_id: uuid.UUID, session: DbSession, caller: ConsoleUser, page: Paging
) -> Page[KeyRead]:
    service.get_customer(session, customer_id, caller)
    query = key_service.customer_keys_query(customer_id)
    return paginate(session, query, page, KeyRead)
