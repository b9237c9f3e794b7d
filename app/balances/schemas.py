from __future__ import annotations

import uuid
from datetime import datetime
from decimal import Decimal

from pydantic import Field

from app.balances.models import BalanceEntry
from app.core.money import from_minor
from app.core.schemas import Amount, Schema


class TopUpCreate(Schema):
    amount: Amount = Field(description="Paid in advance, in the customer's currency.")
    reason: str = Field(min_length=1, max_length=500, description="Shown on the ledger.")


class BalanceRead(Schema):
    customer_id: uuid.UUID
    currency: str
    balance: str = Field(description="What the next invoices may take, after tax and vouchers.")
    low_threshold: str
    low: bool = Field(description="The balance is below low_threshold.")

    @classmethod
    def of(
        cls, customer_id: uuid.UUID, currency: str, balance: Decimal, threshold: Decimal
    ) -> BalanceRead:
        return cls(
            customer_id=customer_id,
            currency=currency,
            balance=str(balance),
            low_threshold=str(threshold),
            low=balance < threshold,
        )


class BalanceEntryRead(Schema):
    seq: int
    customer_id: uuid.UUID
    kind: str = Field(description="trial, top_up, applied (negative) or returned.")
    amount: str
    balance: str = Field(description="The balance after this entry.")
    currency: str
    invoice_id: uuid.UUID | None
    reason: str
    at: datetime

    @classmethod
    def of(cls, entry: BalanceEntry) -> BalanceEntryRead:
        return cls(
            seq=entry.seq,
            customer_id=entry.customer_id,
            kind=entry.kind,
            amount=str(from_minor(entry.amount_minor, entry.currency)),
            balance=str(from_minor(entry.balance_minor, entry.currency)),
            currency=entry.currency,
            invoice_id=entry.invoice_id,
            reason=entry.reason,
            at=entry.at,
        )
