"""An in-test HTTP server that behaves like the parts of Stripe's API the mirror calls.

Stateful (customers, invoices, invoice items), form-encoded requests and Stripe-shaped JSON
replies and errors, idempotency keys as Stripe implements them (the stored response is
replayed for a repeated key; a reused key with other parameters is a 400
``idempotency_error``), finalize / void / delete of invoices, search by metadata, lists with
``has_more`` pagination, and an outage switch (503s or dropped connections).

Amounts follow Stripe: an invoice's ``total`` is the sum of its items and ``amount_due`` is
``max(total, 0)`` (a negative total becomes customer credit balance, not a negative amount
due); finalizing an invoice with nothing due marks it paid at once. Three-decimal currencies
(BHD, JOD, KWD, OMR, TND) take only amounts whose last digit is 0, as Stripe requires.

Credit notes: created on an open or paid invoice from custom lines (``unit_amount`` x
``quantity``), never for more than the invoice's total less earlier credit notes; an open
invoice's amount due goes down by the credit note, a paid one's credit goes to the
customer's balance. Listed per invoice.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

Obj = dict[str, Any]
Reply = tuple[int, Obj]

_SEARCH_CLAUSE = re.compile(r"metadata\['([^']+)'\]:'([^']*)'")
THREE_DECIMAL = frozenset({"bhd", "jod", "kwd", "omr", "tnd"})


class StripeError(Exception):
    def __init__(self, status: int, type_: str, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.reply: Reply = (
            status,
            {"error": {"type": type_, "message": message, **({"code": code} if code else {})}},
        )


def missing(kind: str, ident: str) -> StripeError:
    return StripeError(
        404, "invalid_request_error", f"No such {kind}: '{ident}'", "resource_missing"
    )


def invalid(message: str, code: str | None = None) -> StripeError:
    return StripeError(400, "invalid_request_error", message, code)


def unflatten(pairs: list[tuple[str, str]]) -> Obj:
    """``metadata[a]=1`` -> ``{"metadata": {"a": "1"}}``, as Stripe reads form bodies."""
    out: Obj = {}
    for key, value in pairs:
        parts = key.replace("]", "").split("[")
        node = out
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return out


@dataclass
class Logged:
    method: str
    path: str
    params: Obj
    idempotency_key: str | None
    status: int


@dataclass
class FakeStripe:
    """The state and the switches a test flips; ``url`` goes into ``base_addresses``."""

    api_key: str = "sk_test_fake"
    customers: dict[str, Obj] = field(default_factory=dict)
    invoices: dict[str, Obj] = field(default_factory=dict)
    items: dict[str, Obj] = field(default_factory=dict)
    credit_notes: dict[str, Obj] = field(default_factory=dict)
    log: list[Logged] = field(default_factory=list)
    # None; "503"; "drop" (connections closed unanswered); "lose" (POSTs done, answers lost)
    outage: str | None = None
    url: str = ""
    search_lags: bool = False  # True: search sees no new objects yet, as Stripe's may for a minute
    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    _numbers: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    _idempotency: dict[str, tuple[tuple[str, str, str], Reply]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # -- the switches and helpers tests use --------------------------------------------------

    @contextmanager
    def down(self, mode: str = "503") -> Iterator[None]:
        self.outage = mode
        try:
            yield
        finally:
            self.outage = None

    def posts(self, path_prefix: str) -> list[Logged]:
        return [e for e in self.log if e.method == "POST" and e.path.startswith(path_prefix)]

    def invoice(self, invoice_id: str | None) -> Obj:
        """The Stripe invoice our invoice was mirrored to (``Invoice.stripe_invoice_id``)."""
        assert invoice_id is not None, "the invoice was never mirrored"
        return self.invoices[invoice_id]

    def items_of(self, invoice_id: str | None) -> list[Obj]:
        assert invoice_id is not None, "the invoice was never mirrored"
        return [item for item in self.items.values() if item["invoice"] == invoice_id]

    def set_status(self, invoice_id: str, status: str) -> Obj:
        with self._lock:
            self.invoices[invoice_id]["status"] = status
            return self.invoices[invoice_id]

    # -- request handling ----------------------------------------------------------------------

    def handle(self, method: str, path: str, params: Obj, headers: Any) -> Reply:
        if headers.get("Authorization") != f"Bearer {self.api_key}":
            return StripeError(401, "invalid_request_error", "Invalid API Key provided").reply
        key = headers.get("Idempotency-Key") if method == "POST" else None
        with self._lock:
            if key is None:
                return self._dispatch(method, path, params)
            fingerprint = (method, path, json.dumps(params, sort_keys=True))
            if key in self._idempotency:
                stored_fingerprint, reply = self._idempotency[key]
                if stored_fingerprint != fingerprint:
                    return StripeError(
                        400,
                        "idempotency_error",
                        "Keys for idempotent requests can only be used with the same "
                        f"parameters they were first used with. Try using a key other than "
                        f"'{key}' if you meant to execute a different request.",
                    ).reply
                return reply
            reply = self._dispatch(method, path, params)
            self._idempotency[key] = (fingerprint, reply)
            return reply

    def _dispatch(self, method: str, path: str, params: Obj) -> Reply:
        for route_method, pattern, handler in self._routes():
            match = re.fullmatch(pattern, path)
            if match and route_method == method:
                try:
                    return 200, handler(params, *match.groups())
                except StripeError as error:
                    return error.reply
        return invalid(f"Unrecognized request URL ({method}: {path}).").reply

    def _routes(self) -> list[tuple[str, str, Callable[..., Obj]]]:
        return [
            ("POST", r"/v1/customers", self._create_customer),
            ("GET", r"/v1/customers/search", self._search(self.customers)),
            ("GET", r"/v1/customers/(cus_\w+)", self._get(self.customers, "customer")),
            ("POST", r"/v1/invoices", self._create_invoice),
            ("GET", r"/v1/invoices", self._list_invoices),
            ("GET", r"/v1/invoices/search", self._search(self.invoices)),
            ("GET", r"/v1/invoices/(in_\w+)", self._get(self.invoices, "invoice")),
            ("DELETE", r"/v1/invoices/(in_\w+)", self._delete_invoice),
            ("POST", r"/v1/invoices/(in_\w+)/finalize", self._finalize),
            ("POST", r"/v1/invoices/(in_\w+)/void", self._void),
            ("POST", r"/v1/invoiceitems", self._create_item),
            ("GET", r"/v1/invoiceitems", self._list_items),
            ("POST", r"/v1/credit_notes", self._create_credit_note),
            ("GET", r"/v1/credit_notes", self._list_credit_notes),
        ]

    def _new_id(self, prefix: str) -> str:
        return f"{prefix}_fake{next(self._ids):06d}"

    def _get(self, store: dict[str, Obj], kind: str) -> Callable[[Obj, str], Obj]:
        def get(_: Obj, ident: str) -> Obj:
            if ident not in store:
                raise missing(kind, ident)
            return store[ident]

        return get

    def _search(self, store: dict[str, Obj]) -> Callable[[Obj], Obj]:
        def search(params: Obj) -> Obj:
            clauses = _SEARCH_CLAUSE.findall(params.get("query", ""))
            if not clauses:
                raise invalid("Unsupported search query", "parameter_invalid_string")
            found = [
                obj
                for obj in store.values()
                if all(obj["metadata"].get(k) == v for k, v in clauses) and not self.search_lags
            ]
            return {
                "object": "search_result",
                "data": found,
                "has_more": False,
                "next_page": None,
                "url": "/v1/search",
            }

        return search

    def _create_customer(self, params: Obj) -> Obj:
        customer = {
            "id": self._new_id("cus"),
            "object": "customer",
            "name": params.get("name"),
            "email": params.get("email"),
            "metadata": params.get("metadata", {}),
            "balance": 0,
        }
        self.customers[customer["id"]] = customer
        return customer

    def _create_invoice(self, params: Obj) -> Obj:
        customer = params.get("customer", "")
        if customer not in self.customers:
            raise missing("customer", customer)
        method = params.get("collection_method", "charge_automatically")
        days = params.get("days_until_due")
        if method == "send_invoice" and days is None:
            raise invalid("Missing required param: days_until_due.", "parameter_missing")
        if method == "charge_automatically" and days is not None:
            raise invalid(
                "You can only set `days_until_due` if collection_method is `send_invoice`."
            )
        invoice = {
            "id": self._new_id("in"),
            "object": "invoice",
            "customer": customer,
            "currency": params.get("currency", "usd"),
            "collection_method": method,
            "days_until_due": int(days) if days is not None else None,
            "auto_advance": params.get("auto_advance") == "true",
            "metadata": params.get("metadata", {}),
            "status": "draft",
            "number": None,
            "hosted_invoice_url": None,
            "total": 0,
            "amount_due": 0,
            "amount_paid": 0,
            "livemode": self.api_key.startswith("sk_live_"),
        }
        self.invoices[invoice["id"]] = invoice
        return invoice

    def _list_invoices(self, params: Obj) -> Obj:
        found = [i for i in self.invoices.values() if i["customer"] == params.get("customer")]
        return self._page(found, params, "/v1/invoices")

    def _draft(self, invoice_id: str) -> Obj:
        invoice = self._get(self.invoices, "invoice")({}, invoice_id)
        if invoice["status"] != "draft":
            raise invalid(f"This invoice is already {invoice['status']}.", "invoice_not_editable")
        return invoice

    def _delete_invoice(self, _: Obj, invoice_id: str) -> Obj:
        self._draft(invoice_id)
        del self.invoices[invoice_id]
        return {"id": invoice_id, "object": "invoice", "deleted": True}

    def _finalize(self, _: Obj, invoice_id: str) -> Obj:
        invoice = self._draft(invoice_id)
        number = next(self._numbers)
        invoice.update(
            number=f"FAKE-{number:04d}",
            hosted_invoice_url=f"{self.url}/hosted/{invoice_id}",
            status="open" if invoice["amount_due"] > 0 else "paid",
        )
        return invoice

    def _void(self, _: Obj, invoice_id: str) -> Obj:
        invoice = self._get(self.invoices, "invoice")({}, invoice_id)
        if invoice["status"] not in ("open", "uncollectible"):
            raise invalid(f"You can only void open invoices; this one is {invoice['status']}.")
        invoice["status"] = "void"
        return invoice

    def _create_item(self, params: Obj) -> Obj:
        invoice = self._draft(params.get("invoice", ""))
        if params.get("customer") != invoice["customer"]:
            raise invalid("The invoice belongs to another customer.")
        if params.get("currency") != invoice["currency"]:
            raise invalid("The currency of the item does not match the invoice's currency.")
        amount = _amount(params, "amount", invoice["currency"])
        item = {
            "id": self._new_id("ii"),
            "object": "invoiceitem",
            "customer": invoice["customer"],
            "invoice": invoice["id"],
            "amount": amount,
            "currency": invoice["currency"],
            "description": params.get("description"),
            "metadata": params.get("metadata", {}),
        }
        self.items[item["id"]] = item
        invoice["total"] += amount
        invoice["amount_due"] = max(invoice["total"], 0)
        return item

    def _list_items(self, params: Obj) -> Obj:
        return self._page(self.items_of(params.get("invoice", "")), params, "/v1/invoiceitems")

    def _create_credit_note(self, params: Obj) -> Obj:
        invoice = self._get(self.invoices, "invoice")({}, params.get("invoice", ""))
        if invoice["status"] not in ("open", "paid"):
            raise invalid(f"You can't create a credit note for a {invoice['status']} invoice.")
        lines = list(params.get("lines", {}).values())
        if not lines or any(line.get("type") != "custom_line_item" for line in lines):
            raise invalid("lines of type custom_line_item are required", "parameter_missing")
        total = sum(
            _amount(line, "unit_amount", invoice["currency"]) * int(line.get("quantity", 1))
            for line in lines
        )
        credited = sum(
            n["total"] for n in self.credit_notes.values() if n["invoice"] == invoice["id"]
        )
        if total <= 0 or total + credited > invoice["total"]:
            raise invalid(
                f"The credit note's total ({total}) must be positive and at most the invoice's "
                f"remaining total ({invoice['total'] - credited}).",
                "credit_note_amount_too_large",
            )
        if invoice["status"] == "open":
            invoice["amount_due"] = max(invoice["amount_due"] - total, 0)
        else:
            self.customers[invoice["customer"]]["balance"] -= total
        note = {
            "id": self._new_id("cn"),
            "object": "credit_note",
            "invoice": invoice["id"],
            "customer": invoice["customer"],
            "currency": invoice["currency"],
            "total": total,
            "status": "issued",
            "memo": params.get("memo"),
            "metadata": params.get("metadata", {}),
        }
        self.credit_notes[note["id"]] = note
        return note

    def _list_credit_notes(self, params: Obj) -> Obj:
        found = [n for n in self.credit_notes.values() if n["invoice"] == params.get("invoice")]
        return self._page(found, params, "/v1/credit_notes")

    @staticmethod
    def _page(objects: list[Obj], params: Obj, url: str) -> Obj:
        newest_first = objects[::-1]
        after = params.get("starting_after")
        if after:
            ids = [o["id"] for o in newest_first]
            newest_first = newest_first[ids.index(after) + 1 :] if after in ids else []
        limit = int(params.get("limit", 10))
        return {
            "object": "list",
            "data": newest_first[:limit],
            "has_more": len(newest_first) > limit,
            "url": url,
        }


def _amount(params: Obj, name: str, currency: str) -> int:
    try:
        amount = int(params[name])
    except (KeyError, ValueError):
        raise invalid(f"Invalid integer: {name}", "parameter_invalid_integer") from None
    if currency in THREE_DECIMAL and amount % 10:
        raise invalid(
            f"Invalid {name}: {currency.upper()} amounts must be rounded to the nearest ten "
            "(their last digit must be 0).",
            "invalid_amount",
        )
    return amount


def _handler_for(fake: FakeStripe) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *_: Any) -> None:  # quiet test output
            pass

        def _serve(self) -> None:
            split = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length).decode() if length else ""
            pairs = parse_qsl(split.query, keep_blank_values=True)
            pairs += parse_qsl(body, keep_blank_values=True)
            params = unflatten(pairs)
            if fake.outage == "drop":
                self.close_connection = True
                self.connection.close()
                return
            if fake.outage == "503":
                status, reply = StripeError(503, "api_error", "Service unavailable").reply
            else:
                status, reply = fake.handle(self.command, split.path, params, self.headers)
            key = self.headers.get("Idempotency-Key")
            fake.log.append(Logged(self.command, split.path, params, key, status))
            if fake.outage == "lose" and self.command == "POST":
                self.close_connection = True  # done in Stripe, but the answer never arrives
                self.connection.close()
                return
            data = json.dumps(reply).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Request-Id", f"req_fake{len(fake.log)}")
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_DELETE = _serve

    return Handler


@contextmanager
def running(fake: FakeStripe) -> Iterator[FakeStripe]:
    """Serve ``fake`` on 127.0.0.1 at a random port for the duration of the block."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(fake))
    server.daemon_threads = True
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
