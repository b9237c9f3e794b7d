"""`gpumeter invoices run | list | show | finalize | void`: the invoice routes' services, each
command in one transaction."""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime

from app.billing.models import InvoiceStatus
from app.billing.schemas import InvoiceLineRead, InvoiceRead, InvoiceSummary, VoidBody
from app.billing.wording import label, line_facts, percent
from app.cli.common import (
    OPERATOR,
    Column,
    Group,
    add_output,
    add_paging,
    add_yes,
    command,
    confirmed,
    field_of,
    group,
    identifier,
    member_of,
    month,
    paging,
    past_time,
    print_fields,
    print_json,
    print_page,
    print_table,
    show,
    started_month,
    transaction,
)
from app.core.pagination import paginate


def cmd_invoices_run(args: argparse.Namespace) -> int:
    from app.billing.progress import ProgressBar
    from app.billing.run import as_of_time, run_invoices
    from app.billing.service import BillingSettings
    from app.settings import get_settings
    from app.wiring import install as install_subscribers

    install_subscribers()  # finalizing queues the Stripe mirror, webhooks
    # One transaction for the whole run: all drafts change together or not at all.
    with transaction(args) as session:
        summary = run_invoices(
            session,
            args.period,
            as_of_time(args.as_of, datetime.now(UTC), ("--as-of",)),
            config=BillingSettings.of(get_settings()),
            customer_id=args.customer,
            finalize=args.finalize,
            force=args.force,
            progress=ProgressBar("customers"),
        )
    for customer_id, message in summary.failures.items():
        print(f"customer {customer_id} skipped: {message}", file=sys.stderr)
    print(summary.line())
    return 1 if summary.failures else 0


def _money(amount: str, invoice: InvoiceSummary) -> str:
    return f"{amount} {invoice.currency}"


INVOICE_COLUMNS = [
    Column("ID", lambda i: i.id),
    Column("NUMBER", lambda i: i.number),
    Column("CUSTOMER", lambda i: i.customer_id),
    Column("PERIOD", lambda i: i.period),
    Column("STATUS", lambda i: i.status.value),
    Column("TOTAL", lambda i: _money(i.total, i), right=True),
    Column("AMOUNT DUE", lambda i: _money(i.amount_due, i), right=True),
    Column("DUE", lambda i: i.due_at),
]


def cmd_invoices_list(args: argparse.Namespace) -> int:
    from app.billing.reads import invoices_query, readable_invoices

    query = invoices_query(
        readable_invoices(OPERATOR),
        customer_id=args.customer,
        period=args.period,
        status=args.status,
    )
    with transaction(args) as session:
        page = paginate(session, query, paging(args), InvoiceSummary, InvoiceSummary.of)
    print_page(page, INVOICE_COLUMNS, "no invoices", args.json)
    return 0


LINE_COLUMNS = [
    Column("#", lambda line: line.position, right=True),
    Column("LINE", lambda line: label(line.kind)),
    Column("DETAIL", lambda line: _detail(line)),
    Column("SECONDS", lambda line: line.seconds, right=True),
    Column("RATE", lambda line: line.rate, right=True),
    Column("AMOUNT", lambda line: line.amount, right=True),
]


def _detail(line: InvoiceLineRead) -> str:
    return ", ".join(line_facts(line, show))


def print_invoice(invoice: InvoiceRead, as_json: bool) -> None:
    if as_json:
        print_json(invoice)
        return
    print_fields(
        [
            ("invoice", f"{invoice.number or '(draft, not numbered)'}  {invoice.id}"),
            ("customer", invoice.customer_id),
            ("period", f"{invoice.period} ({invoice.timezone})"),
            ("status", invoice.status.value),
            ("generated", invoice.generated_at),
            ("finalized", invoice.finalized_at),
            ("due", invoice.due_at),
            ("paid", invoice.paid_at),
            ("voided", invoice.voided_at and f"{show(invoice.voided_at)}: {invoice.void_reason}"),
            ("subtotal", _money(invoice.subtotal, invoice)),
            ("tax", f"{_money(invoice.tax, invoice)} ({percent(invoice.tax_rate)})"),
            ("total", _money(invoice.total, invoice)),
            ("amount due", f"{_money(invoice.amount_due, invoice)} (total less prepaid balance)"),
        ]
    )
    print()
    print_table(invoice.lines, LINE_COLUMNS, "no lines")


def cmd_invoices_show(args: argparse.Namespace) -> int:
    from app.billing.service import get_invoice

    with transaction(args) as session:
        invoice = InvoiceRead.of(get_invoice(session, args.invoice_id, OPERATOR))
    print_invoice(invoice, args.json)
    return 0


def cmd_invoices_finalize(args: argparse.Namespace) -> int:
    from app.billing.service import BillingSettings, get_invoice, refresh_and_finalize
    from app.settings import get_settings
    from app.wiring import install as install_subscribers

    install_subscribers()  # finalizing queues the Stripe mirror, webhooks
    with transaction(args) as session:
        invoice = get_invoice(session, args.invoice_id, OPERATOR, lock=True)
        now = datetime.now(UTC)
        config = BillingSettings.of(get_settings())
        finalized = InvoiceRead.of(
            refresh_and_finalize(session, invoice, now, config, force=args.force)
        )
    print_invoice(finalized, args.json)
    return 0


def cmd_invoices_void(args: argparse.Namespace) -> int:
    from app.billing.service import get_invoice, void_invoice
    from app.wiring import install as install_subscribers

    with transaction(args) as session:
        shown = InvoiceRead.of(get_invoice(session, args.invoice_id, OPERATOR))
    question = (
        f"Void invoice {shown.number or '(draft)'} of customer {shown.customer_id} for "
        f"{shown.period} (amount due {_money(shown.amount_due, shown)})? Its number stays "
        "used, the vouchers it used come back, those it earned and nobody spent are taken "
        "back, and a run of the period drafts a replacement."
    )
    if not confirmed(args, question):
        print("not voided", file=sys.stderr)
        return 1
    install_subscribers()  # voiding queues the Stripe mirror, webhooks
    with transaction(args) as session:
        invoice = get_invoice(session, args.invoice_id, OPERATOR, lock=True)
        voided = InvoiceRead.of(void_invoice(session, invoice, datetime.now(UTC), args.reason))
    print_invoice(voided, args.json)
    return 0


def add_invoices(commands: Group) -> None:
    invoices = group(commands, "invoices", "run, list, show, finalize and void invoices")
    _add_run(invoices)
    listed = command(invoices, "list", cmd_invoices_list, "invoices, newest period first")
    listed.add_argument("--customer", type=identifier("a customer"), help="one customer's only")
    listed.add_argument("--period", type=month, help="one billing month's only (YYYY-MM)")
    listed.add_argument(
        "--status",
        type=member_of(InvoiceStatus),
        choices=list(InvoiceStatus),
        help="only in this state",
    )
    add_paging(listed)
    add_output(listed)
    shown = command(invoices, "show", cmd_invoices_show, "one invoice with its lines")
    finalize = command(
        invoices,
        "finalize",
        cmd_invoices_finalize,
        "rebuild a draft invoice with current data, number it and lock it",
    )
    finalize.add_argument(
        "--force", action="store_true", help="finalize before the period's grace time passed"
    )
    void = command(
        invoices,
        "void",
        cmd_invoices_void,
        "void a finalized invoice: it keeps its number, the vouchers it used come back, and "
        "a new draft may replace it",
    )
    void.add_argument(
        "--reason",
        type=field_of(VoidBody, "reason"),
        required=True,
        help="why, kept with the invoice",
    )
    add_yes(void, "void")
    for one in (shown, finalize, void):
        one.add_argument("invoice_id", type=identifier("an invoice"), help="the invoice's id")
        add_output(one)


def _add_run(invoices: Group) -> None:
    run = command(
        invoices,
        "run",
        cmd_invoices_run,
        "draft (and with --finalize, finalize) every customer's invoice for a period; "
        "idempotent, finalized invoices are never touched",
    )
    run.add_argument("--period", type=started_month, required=True, help="billing month, YYYY-MM")
    run.add_argument("--customer", type=identifier("a customer"), help="one customer id")
    run.add_argument("--finalize", action="store_true", help="number and lock them")
    run.add_argument(
        "--force", action="store_true", help="finalize before the period's grace time passed"
    )
    run.add_argument(
        "--as-of",
        type=past_time,
        default=None,
        help="run as of this past time (ISO 8601 with a zone, e.g. 2026-11-01T06:00:00Z): "
        "grace, vouchers, generated_at and finalized_at are judged then (default: now)",
    )
