"""Balance ledger queries; only app.balances writes ``balance_entries``."""

from __future__ import annotations

import uuid
from collections.abc import Collection

from sqlalchemy import Select, select
from sqlalchemy.dialects.postgresql import distinct_on
from sqlalchemy.orm import Session

from app.auth.service import Principal
from app.auth.tenancy import readable_by
from app.balances.models import BalanceEntry
from app.core.db import lock_keys


def readable_entries(principal: Principal) -> Select[BalanceEntry]:
    """Every ledger entry the principal may read; the API's ledger lists start here."""
    return select(BalanceEntry).where(readable_by(principal, BalanceEntry.customer_id))


def entries_query(readable: Select[BalanceEntry], customer_id: uuid.UUID) -> Select[BalanceEntry]:
    """A customer's ledger, newest first."""
    query = readable.where(BalanceEntry.customer_id == customer_id)
    return query.order_by(BalanceEntry.seq.desc())


def lock_ledger(session: Session, customer_id: uuid.UUID) -> None:
    """Serialise every movement of one customer's balance until the transaction ends, so each
    entry's running balance follows the one before it and nothing is spent twice."""
    lock_ledgers(session, [customer_id])


def lock_ledgers(session: Session, customer_ids: Collection[uuid.UUID]) -> None:
    """``lock_ledger`` for many customers in one statement, in a fixed order (no deadlock)."""
    lock_keys(session, (f"balance:{customer_id}" for customer_id in customer_ids))


def latest(session: Session, customer_id: uuid.UUID, currency: str) -> BalanceEntry | None:
    query = select(BalanceEntry).where(
        BalanceEntry.customer_id == customer_id, BalanceEntry.currency == currency
    )
    return session.scalar(query.order_by(BalanceEntry.seq.desc()).limit(1))


def latest_of(
    session: Session, customer_ids: Collection[uuid.UUID]
) -> dict[tuple[uuid.UUID, str], BalanceEntry]:
    """Each customer's latest entry per currency, in one statement."""
    query = (
        select(BalanceEntry)
        .where(BalanceEntry.customer_id.in_(customer_ids))
        .ext(distinct_on(BalanceEntry.customer_id, BalanceEntry.currency))
        .order_by(BalanceEntry.customer_id, BalanceEntry.currency, BalanceEntry.seq.desc())
    )
    return {(e.customer_id, e.currency): e for e in session.scalars(query)}


def by_key(session: Session, key: str) -> BalanceEntry | None:
    return session.scalar(select(BalanceEntry).where(BalanceEntry.key == key))
