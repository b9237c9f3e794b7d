"""Idempotency keys on every POST of the API, as Stripe's API has them.

A POST that carries ``Idempotency-Key: <1-255 visible ASCII characters>`` is run once per key
and caller: its answer (status, body, headers) is stored with the request's fingerprint
(method, path and query, SHA-256 of the body: of its JSON content, keys sorted), and a retry of
the same request with the same key, within ``GPUMETER_IDEMPOTENCY_KEY_TTL_S``, gets that answer
again (with ``Idempotent-Replayed: true``) and creates nothing. The same key with another
request is a 422; while the first request is still running, a second with its key is a 409.
Keys are scoped by the caller's tenant (``owner``: a customer, the operator's admin keys, a
node), so one tenant's key never finds another's answer.

One transaction: this middleware opens the request's transaction before the app runs, takes a
transaction-scoped advisory lock on (owner, key) (the in-flight guard: a second request's
try-lock fails, 409), and lends the transaction to the endpoint's session
(``app.core.deps.OpenedTransaction``). A 2xx answer is stored in that same transaction and the
whole commits before a byte of the answer is sent: a crash leaves both the effects and the
stored answer, or neither. Any other answer changed nothing (the endpoint raised, or the
request was refused before it ran): it rolls back and is not kept, so a retry runs again.

Ingest (``POST /v1/ingest``) is served ahead of this stack and is idempotent by its records'
natural keys (GPU and start second); Stripe's signed webhook has no API key and is idempotent by
Stripe's event id. Expired keys are purged by ``purge_expired_keys`` (periodic, bounded).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import procrastinate
from cryptography.fernet import InvalidToken
from procrastinate import job_context
from sqlalchemy import (
    Engine,
    LargeBinary,
    SmallInteger,
    Text,
    delete,
    func,
    select,
    text,
    tuple_,
)
from sqlalchemy.dialects.postgresql import JSONB, insert
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.orm import Mapped, Session, mapped_column
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.core.base import Base
from app.core.crypto import EncryptedBytes
from app.core.db import begun_session, transaction
from app.core.deps import OPENED_TRANSACTION, OpenedTransaction
from app.core.errors import ApiError, Conflict, Unprocessable, database_unavailable
from app.core.limits import send_api_error
from app.settings import Settings

log = logging.getLogger(__name__)

HEADER = "Idempotency-Key"
MAX_KEY_LENGTH = 255
KEY_PATTERN = f"^[!-~]{{1,{MAX_KEY_LENGTH}}}$"  # visible ASCII: a UUID, say
_KEY = re.compile(KEY_PATTERN)
REPLAYED = b"idempotent-replayed"
# Made anew for each answer, or never repeated: not kept with a stored answer.
_NOT_KEPT = frozenset({b"content-length", b"date", b"server", b"set-cookie", b"connection"})
_LOC = ("header", HEADER.lower())

# The purge: at most this many expired keys per run, every 5 minutes (2.9 M a day).
PURGE_BATCH = 10_000

# The caller's tenant from a request's scope (None: not an API-key caller, left alone).
Owner = Callable[[Scope], str | None]


class IdempotencyKey(Base):
    """A POST's key, its request's fingerprint and its stored answer."""

    __tablename__ = "idempotency_keys"

    owner: Mapped[str] = mapped_column(Text, primary_key=True)
    key: Mapped[str] = mapped_column(Text, primary_key=True)
    method: Mapped[str] = mapped_column(Text)
    path: Mapped[str] = mapped_column(Text)
    body_sha256: Mapped[bytes] = mapped_column(LargeBinary)
    status: Mapped[int] = mapped_column(SmallInteger)
    headers: Mapped[list[list[str]]] = mapped_column(JSONB)
    # Encrypted at rest: an answer may show a secret once (a new API key, a signing secret).
    body: Mapped[bytes] = mapped_column(EncryptedBytes)
    created_at: Mapped[datetime] = mapped_column(server_default=func.now(), index=True)


@dataclass(frozen=True)
class Fingerprint:
    method: str
    path: str
    body_sha256: bytes

    @classmethod
    def of(cls, scope: Scope, body: bytes) -> Fingerprint:
        query = scope.get("query_string", b"").decode("latin-1")
        path = scope["path"] + (f"?{query}" if query else "")
        return cls(scope["method"], path, hashlib.sha256(_canonical(body)).digest())


def _canonical(body: bytes) -> bytes:
    """A JSON body as its content (keys sorted, no spaces): a client's retry that serializes
    the same request differently is the same request. Anything else: its bytes."""
    try:
        content = json.loads(body)
        return json.dumps(content, sort_keys=True, separators=(",", ":")).encode()
    except (ValueError, RecursionError):
        return body


@dataclass
class Answer:
    """An answer as the app sent it, held until its transaction commits."""

    status: int = 0
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    body: bytearray = field(default_factory=bytearray)

    async def capture(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            self.headers = list(message.get("headers", []))
        elif message["type"] == "http.response.body":
            self.body += message.get("body", b"")

    @classmethod
    def of(cls, row: IdempotencyKey) -> Answer:
        headers = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in row.headers]
        return cls(row.status, [*headers, (REPLAYED, b"true")], bytearray(row.body))

    @property
    def kept_headers(self) -> list[list[str]]:
        return [
            [name.decode("latin-1"), value.decode("latin-1")]
            for name, value in self.headers
            if name.lower() not in _NOT_KEPT
        ]

    async def send_to(self, send: Send) -> None:
        length = (b"content-length", str(len(self.body)).encode())
        headers = [h for h in self.headers if h[0].lower() != b"content-length"] + [length]
        await send({"type": "http.response.start", "status": self.status, "headers": headers})
        await send({"type": "http.response.body", "body": bytes(self.body)})


class IdempotentPosts:
    """The middleware (see the module doc); ``owner`` names the caller's tenant."""

    def __init__(self, app: ASGIApp, owner: Owner, ttl_s: int) -> None:
        self.app = app
        self.owner = owner
        self.ttl = timedelta(seconds=ttl_s)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        key = Headers(scope=scope).get(HEADER) if scope["type"] == "http" else None
        owner = self.owner(scope) if key is not None and scope["method"] == "POST" else None
        if key is None or owner is None:
            await self.app(scope, receive, send)
            return
        if not _KEY.fullmatch(key):
            await send_api_error(send, _bad_key())
            return
        body = await _read_body(receive)
        if body is None:
            return  # the client left, or the limits refused the body (and answered)
        fingerprint = await run_in_threadpool(Fingerprint.of, scope, body)  # parses JSON
        engine: Engine = scope["app"].state.engine
        try:
            claimed = await run_in_threadpool(self._claim, engine, owner, key, fingerprint)
        except ApiError as error:
            await send_api_error(send, error, close=False)
            return
        except (DBAPIError, PoolTimeout) as error:
            await _send_unavailable(send, error, scope)
            return
        if isinstance(claimed, Answer):
            await claimed.send_to(send)
            return
        await self._run(scope, _replaying(body, receive), send, claimed, (owner, key, fingerprint))

    async def _run(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        session: Session,
        request: tuple[str, str, Fingerprint],
    ) -> None:
        opened = OpenedTransaction(session)
        scope.setdefault("state", {})[OPENED_TRANSACTION] = opened
        answer = Answer()
        try:
            await self.app(scope, receive, answer.capture)
        except BaseException:
            await asyncio.shield(run_in_threadpool(session.close))  # rolls back
            raise
        if opened.failed or not 200 <= answer.status < 300:
            await run_in_threadpool(session.close)
        else:
            try:
                await run_in_threadpool(_store, session, *request, answer)
            except (DBAPIError, PoolTimeout) as error:
                await _send_unavailable(send, error, scope)
                return
        await answer.send_to(send)

    def _claim(
        self, engine: Engine, owner: str, key: str, fingerprint: Fingerprint
    ) -> Session | Answer:
        """The request's transaction holding the key's lock, if the key is new (or expired);
        else the stored answer to replay. 409 while another request holds the key, 422 when
        the key was first used for another request."""
        session = begun_session(engine)
        try:
            if not session.scalar(_TRY_LOCK, {"key": f"idempotency:{owner}:{key}"}):
                raise Conflict(
                    f"a request with this {HEADER} is still running; retry once it has "
                    "answered, to get its answer",
                    _LOC,
                )
            stored = self._stored(session, owner, key)
        except BaseException:
            session.close()
            raise
        if stored is None:
            return session
        session.close()
        return _replay(stored, fingerprint)

    def _stored(self, session: Session, owner: str, key: str) -> IdempotencyKey | None:
        """The key's unexpired answer, if any; 409 if no encryption key reads it any more."""
        try:
            return session.scalar(
                select(IdempotencyKey).where(
                    IdempotencyKey.owner == owner,
                    IdempotencyKey.key == key,
                    IdempotencyKey.created_at > func.now() - self.ttl,
                )
            )
        except InvalidToken:
            raise Conflict(
                f"this {HEADER}'s first answer can no longer be read (the key that encrypted it "
                "was retired), so it is neither replayed nor run again; send a new key",
                _LOC,
            ) from None


def _replay(stored: IdempotencyKey, fingerprint: Fingerprint) -> Answer:
    """The stored answer, if the retry is the request it answered; else 422 naming that."""
    first = Fingerprint(stored.method, stored.path, stored.body_sha256)
    if first != fingerprint:
        raise Unprocessable(
            f"this {HEADER} was first used for {first.method} {first.path} with "
            + ("another body" if first.path == fingerprint.path else "its own body")
            + f": a retry must repeat that request exactly; a new request needs a new {HEADER}",
            _LOC,
        )
    return Answer.of(stored)


_TRY_LOCK = text("SELECT pg_try_advisory_xact_lock(hashtextextended(:key, 0))")


def _store(session: Session, owner: str, key: str, fp: Fingerprint, answer: Answer) -> None:
    """Keep the answer (replacing an expired one of the key) and commit it with the request's
    effects."""
    try:
        values: dict[str, Any] = {
            "method": fp.method,
            "path": fp.path,
            "body_sha256": fp.body_sha256,
            "status": answer.status,
            "headers": answer.kept_headers,
            "body": bytes(answer.body),
            "created_at": func.now(),
        }
        statement = insert(IdempotencyKey).values(owner=owner, key=key, **values)
        session.execute(
            statement.on_conflict_do_update(
                index_elements=[IdempotencyKey.owner, IdempotencyKey.key], set_=values
            )
        )
        session.commit()
    finally:
        session.close()


def _bad_key() -> Unprocessable:
    return Unprocessable(
        f"{HEADER} must be 1 to {MAX_KEY_LENGTH} visible ASCII characters (a UUID, say)", _LOC
    )


async def _send_unavailable(send: Send, error: Exception, scope: Scope) -> None:
    unavailable = database_unavailable(error, scope["path"])
    if unavailable is None:
        raise error
    await send_api_error(send, unavailable)


async def _read_body(receive: Receive) -> bytes | None:
    """The whole body (bounded by ``RequestLimits`` around this), None if the client left."""
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        body += message.get("body", b"")
        if not message.get("more_body", False):
            return bytes(body)


def _replaying(body: bytes, receive: Receive) -> Receive:
    """``receive`` for the app: the body already read, then the client's own messages."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replay() -> Message:
        return pending.pop() if pending else await receive()

    return replay


# POSTs outside the middleware: ingest (served ahead of the stack, idempotent by its records'
# keys) and Stripe's webhook (no API key; idempotent by Stripe's event id).
SERVED_APART = frozenset({"/v1/ingest", "/v1/stripe/webhook"})


def document(schema: dict[str, Any]) -> None:
    """The ``Idempotency-Key`` header on every POST the middleware serves (all but ingest's
    and Stripe's signed webhook: ``SERVED_APART``)."""
    parameter = {
        "name": HEADER,
        "in": "header",
        "required": False,
        "description": (
            "Makes the POST safe to retry: a retry with the same key and request within "
            "GPUMETER_IDEMPOTENCY_KEY_TTL_S (24 h) gets the first answer (with "
            "`Idempotent-Replayed: true`) and creates nothing; the key with another request "
            "is a 422, while the first is still running a 409. Scoped to the caller's tenant."
        ),
        "schema": {
            "type": "string",
            "minLength": 1,
            "maxLength": MAX_KEY_LENGTH,
            "pattern": KEY_PATTERN,
        },
    }
    for path, operations in schema["paths"].items():
        post = operations.get("post")
        if post is not None and path.startswith("/v1/") and path not in SERVED_APART:
            post.setdefault("parameters", []).append(dict(parameter))


def purge_expired(session: Session, ttl: timedelta, limit: int = PURGE_BATCH) -> int:
    """Delete up to ``limit`` keys older than ``ttl``, oldest first; how many went."""
    expired = (
        select(IdempotencyKey.owner, IdempotencyKey.key)
        .where(IdempotencyKey.created_at <= func.now() - ttl)
        .order_by(IdempotencyKey.created_at)
        .limit(limit)
    )
    columns = tuple_(IdempotencyKey.owner, IdempotencyKey.key)
    result = session.execute(delete(IdempotencyKey).where(columns.in_(expired)))
    return int(result.rowcount)  # type: ignore[attr-defined]


tasks = procrastinate.Blueprint()


@tasks.periodic(cron="*/5 * * * *")
@tasks.task(name="purge", queueing_lock="idempotency_purge", pass_context=True)
def purge_expired_keys(context: job_context.JobContext, timestamp: int) -> int:
    """Every 5 minutes: purge expired idempotency keys (idempotent: deletes only expired ones,
    at most ``PURGE_BATCH``; the next run takes what is left)."""
    engine: Engine = context.additional_context["engine"]
    settings: Settings = context.additional_context["settings"]
    with transaction(engine) as session:
        purged = purge_expired(session, timedelta(seconds=settings.idempotency_key_ttl_s))
    if purged:
        log.info("purged expired idempotency keys", extra={"count": purged})
    return purged
