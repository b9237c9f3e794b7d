"""Hypothesis: whatever mix of top-ups, invoices and voids, the balance never goes negative,
an invoice never takes more than it totals, and the ledger sums to the balance."""

from __future__ import annotations

import uuid
from decimal import Decimal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

from app.balances import service
from app.balances.models import BalanceEntry
from app.billing.core.invoice import build_invoice
from app.billing.core.lines import InvoiceLine, LineKind, sum_amounts
from app.core.money import to_minor
from app.customers.models import Customer
from app.customers.schemas import CustomerCreate
from app.customers.service import create_customer
from app.settings import get_settings

pytestmark = pytest.mark.usefixtures("trial")

cents = st.integers(min_value=1, max_value=5_000)
operations = st.lists(
    st.one_of(
        st.tuples(st.just("top_up"), cents),
        st.tuples(st.just("invoice"), cents),
        st.tuples(st.just("void"), st.integers(min_value=0, max_value=20)),
    ),
    max_size=25,
)


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(operations, st.sampled_from(["0", "0.19"]))
def test_balance_never_negative_and_the_ledger_adds_up(
    db: Engine, ops: list[tuple[str, int]], tax_rate: str
) -> None:
    with Session(db) as session:  # rolled back: each example starts from an empty ledger
        customer = create_customer(session, CustomerCreate(name="Prop"))
        finalized: list[uuid.UUID] = []
        for op, value in ops:
            if op == "top_up":
                service.top_up(session, customer, Decimal(value).scaleb(-2), "prop")
            elif op == "invoice":
                finalized += _invoice(session, customer, value, Decimal(tax_rate))
            elif finalized:
                invoice_id = finalized.pop(value % len(finalized))
                service.return_from_invoice(session, customer, invoice_id, "GM-prop")
            _check_ledger(session, customer.id, service.balance(session, customer))
        session.rollback()


def _invoice(session: Session, customer: Customer, due_cents: int, tax: Decimal) -> list[uuid.UUID]:
    """An invoice of ``due_cents`` before tax, built as billing builds it, then finalized."""
    invoice_id = uuid.uuid4()
    charge = InvoiceLine(LineKind.ADJUSTMENT, Decimal(due_cents).scaleb(-2), "USD")
    available = service.available(session, [customer])[customer.id]
    built = build_invoice(str(invoice_id), "c", "USD", [], [], 0, tax, [charge], available)
    prepaid = [line.amount for line in built.lines if line.kind is LineKind.PREPAID_BALANCE]
    before_balance = sum_amounts(
        [line for line in built.lines if line.kind is not LineKind.PREPAID_BALANCE], "USD"
    )
    assert built.total >= 0
    assert -sum(prepaid, Decimal(0)) <= min(available, before_balance)  # applied <= total
    if not prepaid:
        return []
    low = get_settings().balance_low_threshold
    service.apply_to_invoice(session, customer, invoice_id, "GM-prop", -prepaid[0], low)
    return [invoice_id]


def _check_ledger(session: Session, customer_id: uuid.UUID, balance: Decimal) -> None:
    total, lowest = session.execute(
        select(func.sum(BalanceEntry.amount_minor), func.min(BalanceEntry.balance_minor)).where(
            BalanceEntry.customer_id == customer_id
        )
    ).one()
    assert balance >= 0
    assert lowest is None or lowest >= 0
    assert (total or 0) == to_minor(balance, "USD")
