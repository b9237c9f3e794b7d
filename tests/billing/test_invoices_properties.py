"""Property (DB level): re-running an invoice run over random usage changes nothing, every
stored invoice's total is the sum of its lines, every rental's net per price period is its
billed seconds x price, and a capped rental pays at most its prorated cap."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, select, text

from app.billing.models import Invoice, InvoiceLineRow, VoucherEntryRow
from app.billing.run import run_invoices
from app.billing.service import BillingSettings
from app.core.db import transaction
from app.core.money import round_money, time_amount
from app.customers.models import Customer
from app.fleet.models import Gpu, Node
from app.metering.repository import write_segments
from app.metering.segments import Span
from app.plans.models import PlanPrice, PricePlan
from app.rentals.models import GpuAssignment, Migration, Rental
from app.settings import get_settings

START = int(datetime(2026, 10, 1, tzinfo=UTC).timestamp())
END = int(datetime(2026, 11, 1, tzinfo=UTC).timestamp())
NOW = datetime(2026, 11, 10, tzinfo=UTC)
STATES = ("healthy", "degraded", "failed")
CAP = "700"  # per GPU-month, from 16 Oct: 16 days at 1.99/h are 764.16

cuts = st.lists(st.integers(START, END), min_size=2, max_size=8, unique=True).map(sorted)
gpu_usage = st.tuples(cuts, st.lists(st.sampled_from((*STATES, None)), min_size=7, max_size=7))


def _at(epoch: int) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)


def _world(db: Engine, gpus: list[tuple[list[int], list[str | None]]], increment: int) -> None:
    with transaction(db) as session:
        session.execute(text("TRUNCATE customers, nodes, price_plans RESTART IDENTITY CASCADE"))
        customer = Customer(name="p", currency="USD", tax_rate=Decimal("0.07"))
        plan = PricePlan(
            name="p",
            currency="USD",
            increment_s=increment,
            minimum_s=increment,
            voucher_tiers=[{"min_days": 7, "percent": "5"}],
        )
        node = Node(hostname="n", datacenter="d")
        session.add_all([customer, plan, node])
        session.flush()
        session.add(
            PlanPrice(
                plan_id=plan.id,
                gpu_model="H100",
                price_per_hour=Decimal("2.49"),
                effective_from=_at(START - 86400),
            )
        )
        session.add(
            PlanPrice(
                plan_id=plan.id,
                gpu_model="H100",
                price_per_hour=Decimal("1.99"),
                monthly_cap_per_gpu=Decimal(CAP),  # binds for a GPU healthy from day 15 on
                effective_from=_at(START + 15 * 86400),
            )
        )
        spans = []
        for g, (bounds, states) in enumerate(gpus):
            gpu = f"GPU-{g}"
            session.add(Gpu(uuid=gpu, node_id=node.id, model="H100"))
            rental = Rental(
                id=uuid.uuid4(),
                customer_id=customer.id,
                plan_id=plan.id,
                gpu_model="H100",
                gpu_count=1,
                start_at=_at(bounds[0]),
            )
            session.add(rental)
            session.flush()
            session.add(
                GpuAssignment(
                    rental_id=rental.id,
                    customer_id=customer.id,
                    gpu_uuid=gpu,
                    start_at=_at(bounds[0]),
                    end_at=_at(bounds[-1]),
                )
            )
            if len(bounds) > 2:  # a migration window inside the rental, to the next GPU name
                spare = f"SPARE-{g}"
                session.add(Gpu(uuid=spare, node_id=node.id, model="H100"))
                session.flush()
                session.add(
                    Migration(
                        rental_id=rental.id,
                        customer_id=customer.id,
                        from_gpu_uuid=gpu,
                        to_gpu_uuid=spare,
                        failed_at=_at(bounds[1]),
                        resumed_at=_at(bounds[1] + 30),
                    )
                )
            for a, b, state in zip(bounds, bounds[1:], states, strict=False):
                if state is not None:
                    spans.append(
                        (gpu, Span(a, b, state, {"code": 79} if state == "failed" else None))
                    )
        session.flush()
        write_segments(session, spans, [])


def _check_rental_lines(lines: list[InvoiceLineRow]) -> None:
    """Per price period (a charge line): charge + its credits = round(billed s x price); the
    capped period pays at most cap x (its uncredited seconds ÷ the month's seconds)."""
    credits = {"failure_credit", "migration_credit", "degraded_credit"}
    for charge in (x for x in lines if x.kind == "charge"):
        assert charge.start_at and charge.end_at and charge.rate is not None
        mine = [
            x
            for x in lines
            if x.kind in credits
            and x.rental_id == charge.rental_id
            and x.start_at is not None
            and charge.start_at <= x.start_at < charge.end_at
        ]
        billed_s = (charge.seconds or 0) - sum(x.seconds or 0 for x in mine)
        net = charge.amount + sum((x.amount for x in mine), Decimal(0))
        assert net == time_amount(billed_s, charge.rate, "USD")
        if charge.rate == Decimal("1.99"):  # the capped price period
            cap = [x.amount for x in lines if x.kind == "cap" and x.rental_id == charge.rental_id]
            bound = round_money(Decimal(CAP) * billed_s / (END - START), "USD")
            assert net + sum(cap, Decimal(0)) <= bound


def _snapshot(db: Engine) -> list[Any]:
    with transaction(db) as session:
        invoices = session.scalars(select(Invoice).order_by(Invoice.id)).all()
        for invoice in invoices:
            assert invoice.total == sum((line.amount for line in invoice.lines), Decimal(0))
            _check_rental_lines(list(invoice.lines))
        lines = session.execute(
            select(InvoiceLineRow.__table__).order_by(
                InvoiceLineRow.invoice_id, InvoiceLineRow.position
            )
        ).all()
        entries = session.execute(
            select(
                VoucherEntryRow.voucher_id, VoucherEntryRow.kind, VoucherEntryRow.amount
            ).order_by(VoucherEntryRow.voucher_id, VoucherEntryRow.kind)
        ).all()
        heads = [(i.id, i.status, i.number, i.total, i.tax) for i in invoices]
    return [heads, [tuple(r)[1:] for r in lines], entries]  # line ids are new on each run


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    gpus=st.lists(gpu_usage, min_size=1, max_size=3),
    increment=st.sampled_from((1, 60, 3600)),
)
def test_rerunning_an_invoice_run_is_identical(
    db: Engine, gpus: list[tuple[list[int], list[str | None]]], increment: int
) -> None:
    _world(db, gpus, increment)
    snapshots = []
    for finalize in (False, False, True, True):
        with transaction(db) as session:
            run_invoices(
                session,
                "2026-10",
                NOW,
                config=BillingSettings.of(get_settings()),
                finalize=finalize,
            )
        snapshots.append(_snapshot(db))
    assert snapshots[0] == snapshots[1]  # drafts: the same again
    assert snapshots[2] == snapshots[3]  # finalized: never touched again
    assert snapshots[2][1] == snapshots[1][1]  # finalizing a fresh draft keeps its lines
