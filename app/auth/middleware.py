"""Authenticate before the body is read.

FastAPI reads and parses a request's body before it runs the route's dependencies, so without
this an anonymous client could make a worker read (and hold in memory) any body it sends. For
requests that carry a body to the API, the key is checked first (one indexed lookup); without a
valid one the answer is 401 and the body is never read. The principal found is handed to
``current_principal`` through ``request.state``, so the key is looked up only once. A key this
process verified lately (``app.auth.cache``) is trusted without the database or a thread.
"""

from __future__ import annotations

from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from app.auth.service import Principal, authenticate, authenticate_cached
from app.core.db import transaction
from app.core.limits import send_error, send_unavailable

_BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# Verified by their own signature over the body, not by an API key.
_SIGNED_PATHS = frozenset({"/v1/stripe/webhook"})


class AuthenticateFirst:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and scope["method"] in _BODY_METHODS
            and scope["path"].startswith("/v1/")
            and scope["path"] not in _SIGNED_PATHS
        ):
            scheme, _, key = Headers(scope=scope).get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not key.strip():
                await _unauthorized(send, "missing API key: send `Authorization: Bearer <key>`")
                return
            principal = authenticate_cached(scope["app"].state.engine, key.strip())
            if principal is None:
                try:
                    principal = await run_in_threadpool(_authenticate, scope, key.strip())
                except (OperationalError, PoolTimeout):
                    await send_unavailable(send, "the database is unavailable; retry later")
                    return
            if principal is None:
                await _unauthorized(send, "invalid or revoked API key")
                return
            scope.setdefault("state", {})["principal"] = principal
        await self.app(scope, receive, send)


async def _unauthorized(send: Send, msg: str) -> None:
    headers = {"WWW-Authenticate": "Bearer"}
    await send_error(send, 401, msg, "unauthorized", ("header", "authorization"), headers)


def _authenticate(scope: Scope, key: str) -> Principal | None:
    with transaction(scope["app"].state.engine) as session:
        return authenticate(session, key)
