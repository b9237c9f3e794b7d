"""Administration: `admin create-key | register-node`, `keys list | show | revoke`,
`customers list | show`, `gpus claims | settle` (a GPU UUID clash). Each calls the services
the API's routes call, in one transaction."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pydantic import BaseModel

from app.auth.models import KeyKind
from app.auth.schemas import KeyCreate, KeyRead
from app.cli.common import (
    OPERATOR,
    Column,
    Group,
    add_output,
    add_paging,
    command,
    field_of,
    group,
    identifier,
    member_of,
    paging,
    print_fields,
    print_json,
    print_page,
    print_table,
    transaction,
)
from app.core.pagination import paginate
from app.customers.schemas import CustomerRead
from app.fleet.schemas import NodeCreate

KINDS = list(KeyKind)


def cmd_create_key(args: argparse.Namespace) -> int:
    from app.auth.service import issue_key

    kind = args.kind
    owner = {KeyKind.CUSTOMER: ("--customer", args.customer), KeyKind.NODE: ("--node", args.node)}
    if kind in owner and owner[kind][1] is None:
        print(f"{args.prog}: --kind {kind.value} needs {owner[kind][0]} ID", file=sys.stderr)
        return 2
    with transaction(args) as session:
        issued = issue_key(session, kind, args.name, customer_id=args.customer, node_id=args.node)
    print(issued.secret)
    print(
        f"# {kind.value} key {issued.key.id} ({args.name}); it is shown only this once",
        file=sys.stderr,
    )
    return 0


def cmd_register_node(args: argparse.Namespace) -> int:
    from app.fleet import service

    data = NodeCreate(hostname=args.hostname, datacenter=args.datacenter)
    with transaction(args) as session:
        node, issued = service.enroll_node(session, data)
    if args.token_file is None:
        print(issued.secret)
    else:
        args.token_file.write_text(issued.secret + "\n")
        args.token_file.chmod(0o600)
    print(f"# node {node.id} ({args.hostname}): agent token issued", file=sys.stderr)
    return 0


KEY_COLUMNS = [
    Column("ID", lambda k: k.id),
    Column("KIND", lambda k: k.kind.value),
    Column("NAME", lambda k: k.name),
    Column("PREFIX", lambda k: k.prefix),
    Column("OWNER", lambda k: k.customer_id or k.node_id),
    Column("CREATED", lambda k: k.created_at),
    Column("REVOKED", lambda k: k.revoked_at),
]


def cmd_keys_list(args: argparse.Namespace) -> int:
    from app.auth.reads import keys_query

    with transaction(args) as session:
        query = keys_query(kind=args.kind, customer_id=args.customer)
        page = paginate(session, query, paging(args), KeyRead)
    print_page(page, KEY_COLUMNS, "no API keys", args.json)
    return 0


def _print_key(key: KeyRead, as_json: bool) -> None:
    if as_json:
        print_json(key)
    else:
        print_fields([(c.header.lower(), c.value(key)) for c in KEY_COLUMNS])


def cmd_keys_show(args: argparse.Namespace) -> int:
    from app.auth.service import get_key

    with transaction(args) as session:
        key = KeyRead.model_validate(get_key(session, args.key_id))
    _print_key(key, args.json)
    return 0


def cmd_keys_revoke(args: argparse.Namespace) -> int:
    from app.auth.service import revoke_key

    with transaction(args) as session:
        key = KeyRead.model_validate(revoke_key(session, args.key_id))
    _print_key(key, args.json)
    return 0


CUSTOMER_COLUMNS = [
    Column("ID", lambda c: c.id),
    Column("NAME", lambda c: c.name),
    Column("EMAIL", lambda c: c.email),
    Column("CURRENCY", lambda c: c.currency),
    Column("TIMEZONE", lambda c: c.billing_timezone),
    Column("CREATED", lambda c: c.created_at),
]


def cmd_customers_list(args: argparse.Namespace) -> int:
    from app.customers.reads import readable_customers

    with transaction(args) as session:
        page = paginate(session, readable_customers(OPERATOR), paging(args), CustomerRead)
    print_page(page, CUSTOMER_COLUMNS, "no customers", args.json)
    return 0


def cmd_customers_show(args: argparse.Namespace) -> int:
    from app.customers.service import get_customer

    with transaction(args) as session:
        customer = CustomerRead.model_validate(get_customer(session, args.customer_id, OPERATOR))
    if args.json:
        print_json(customer)
    else:
        print_fields(list(customer.model_dump().items()))
    return 0


def add_admin(commands: Group) -> None:
    admin = group(commands, "admin", "create API keys and register nodes")
    create_key = command(admin, "create-key", cmd_create_key, "create an API key and print it once")
    create_key.add_argument(
        "--kind",
        type=member_of(KeyKind),
        choices=KINDS,
        default=KeyKind.ADMIN,
        help="admin: the operator's, everything; customer: one customer's own data; node: an "
        "agent's token for its node's GPUs; scheduler: a scheduler adapter's snapshots and "
        "failover outcomes only (default admin)",
    )
    create_key.add_argument(
        "--name", type=field_of(KeyCreate, "name"), required=True, help="a label for the key"
    )
    create_key.add_argument(
        "--customer", type=identifier("a customer"), help="customer id (for --kind customer)"
    )
    create_key.add_argument("--node", type=identifier("a node"), help="node id (for --kind node)")
    register_node = command(
        admin,
        "register-node",
        cmd_register_node,
        "register a node (or rotate a registered node's token) and output its agent token",
    )
    register_node.add_argument(
        "--hostname", type=field_of(NodeCreate, "hostname"), required=True, help="its hostname"
    )
    register_node.add_argument(
        "--datacenter",
        type=field_of(NodeCreate, "datacenter"),
        default="default",
        help="datacenter label (default 'default')",
    )
    register_node.add_argument(
        "--token-file", type=Path, default=None, help="write the token here (default: stdout)"
    )


def add_keys(commands: Group) -> None:
    keys = group(
        commands,
        "keys",
        "list, show and revoke API keys (create one with `gpumeter admin create-key`)",
    )
    listed = command(keys, "list", cmd_keys_list, "API keys, revoked ones too, oldest first")
    listed.add_argument(
        "--kind", type=member_of(KeyKind), choices=KINDS, help="only keys of this kind"
    )
    listed.add_argument(
        "--customer", type=identifier("a customer"), help="only this customer's keys"
    )
    add_paging(listed)
    add_output(listed)
    for name, handler, text in (
        ("show", cmd_keys_show, "one API key (never its secret: only its digest is stored)"),
        (
            "revoke",
            cmd_keys_revoke,
            "revoke an API key at once, everywhere within GPUMETER_AUTH_REVOCATION_CHECK_S; "
            "the last active admin key cannot be revoked",
        ),
    ):
        one = command(keys, name, handler, text)
        one.add_argument("key_id", type=identifier("an API key"), help="the key's id")
        add_output(one)


def add_customers(commands: Group) -> None:
    customers = group(commands, "customers", "list and show customers")
    listed = command(customers, "list", cmd_customers_list, "customers, oldest first")
    add_paging(listed)
    add_output(listed)
    shown = command(customers, "show", cmd_customers_show, "one customer's details")
    shown.add_argument("customer_id", type=identifier("a customer"), help="the customer's id")
    add_output(shown)


def cmd_gpus_claims(args: argparse.Namespace) -> int:
    from app.fleet import service

    with transaction(args) as session:
        claims = service.held_claims(session, service.get_gpu(session, args.gpu_uuid, OPERATOR))
    _print_with_table(claims, "held", HELD_COLUMNS, "no reports held", args.json)
    return 0


def _print_with_table(
    model: BaseModel, listed: str, columns: list[Column], empty: str, as_json: bool
) -> None:
    """The model's fields, then its list ``listed`` as a table (or all of it as JSON)."""
    if as_json:
        print_json(model)
        return
    print_fields([(k, v) for k, v in model.model_dump().items() if k != listed])
    print_table(getattr(model, listed), columns, empty)


HELD_COLUMNS = [
    Column("NODE", lambda h: h.node_id),
    Column("RECORDS", lambda h: h.records),
    Column("EVENTS", lambda h: h.events),
]
REFUSED_COLUMNS = [*HELD_COLUMNS, Column("REASON", lambda r: r.reason)]


def cmd_gpus_settle(args: argparse.Namespace) -> int:
    from app.fleet import service
    from app.fleet.schemas import Settlement
    from app.fleet.service import IngestGpus
    from app.settings import get_settings

    gpus = IngestGpus.of(get_settings())
    with transaction(args) as session:
        settled = service.settle(session, args.gpu_uuid, Settlement(node_id=args.node), gpus)
    _print_with_table(settled, "refused", REFUSED_COLUMNS, "no held reports refused", args.json)
    return 0


def add_gpus(commands: Group) -> None:
    gpus = group(
        commands,
        "gpus",
        "see and settle a GPU UUID clash (two nodes report one UUID: both nodes' reports of "
        "it are held until it is settled)",
    )
    claims = command(
        gpus, "claims", cmd_gpus_claims, "a GPU's clash: its node and whose reports are held"
    )
    settle = command(
        gpus,
        "settle",
        cmd_gpus_settle,
        "settle a GPU's clash: give it to the node it is on (its held reports are stored, the "
        "other nodes' refused, now and later) or retire it (every report refused)",
    )
    for one in (claims, settle):
        one.add_argument("gpu_uuid", help="the GPU's UUID")
        add_output(one)
    owner = settle.add_mutually_exclusive_group(required=True)
    owner.add_argument("--node", type=identifier("a node"), help="the id of the node it is on")
    owner.add_argument(
        "--retire", action="store_true", help="retire the GPU: no node's reports are kept"
    )
