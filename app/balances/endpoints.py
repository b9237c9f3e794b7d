"""A customer's prepaid balance and its ledger; top-ups by an admin. Customers see their own."""

from __future__ import annotations

import uuid

from fastapi import APIRouter

from app.auth.deps import Admin, ConsoleUser
from app.balances import repository, service
from app.balances.schemas import BalanceEntryRead, BalanceRead, TopUpCreate
from app.core.deps import AppSettings, DbSession
from app.core.pagination import Page, Paging, paginate
from app.customers.service import get_customer

router = APIRouter(prefix="/v1/customers", tags=["balances"])


@router.get("/{customer_id}/balance")
def read_balance(
    customer_id: uuid.UUID, session: DbSession, caller: ConsoleUser, settings: AppSettings
) -> BalanceRead:
    """The prepaid balance (trial credit and top-ups less what invoices took)."""
    customer = get_customer(session, customer_id, caller)
    amount = service.balance(session, customer)
    threshold = service.low_threshold(settings.balance_low_threshold, customer.currency)
    return BalanceRead.of(customer.id, customer.currency, amount, threshold)


@router.get("/{customer_id}/balance/entries")
def list_balance_entries(
    customer_id: uuid.UUID, session: DbSession, caller: ConsoleUser, page: Paging
) -> Page[BalanceEntryRead]:
    """The balance ledger, newest first; each entry carries the balance after it."""
    customer = get_customer(session, customer_id, caller)
    query = repository.entries_query(repository.readable_entries(caller), customer.id)
    return paginate(session, query, page, BalanceEntryRead, BalanceEntryRead.of)


@router.post("/{customer_id}/balance/top-ups", status_code=201)
def create_top_up(
    customer_id: uuid.UUID, body: TopUpCreate, session: DbSession, admin: Admin
) -> BalanceEntryRead:
    """Record money the customer paid in advance (a bank transfer, say)."""
    customer = get_customer(session, customer_id, admin)
    entry = service.top_up(session, customer, body.amount, body.reason, created_by=admin.key_id)
    return BalanceEntryRead.of(entry)
