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
from app.core.errors import ApiError, ServiceUnavailable, Unauthorized
from app.core.limits import send_api_error

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
            try:
                principal = await bearer_principal(scope)
            except ApiError as error:
                await send_api_error(send, error)  # the body stays unread: close
                return
            scope.setdefault("state", {})["principal"] = principal
        await self.app(scope, receive, send)


async def bearer_principal(scope: Scope) -> Principal:
    """The principal of the request's ``Authorization: Bearer`` key, from memory or the
    database; 401 without a valid one, 503 when the database cannot say."""
    scheme, _, key = Headers(scope=scope).get("authorization", "").partition(" ")
    key = key.strip()
    if scheme.lower() != "bearer" or not key:
        raise _unauthorized("missing API key: send `Authorization: Bearer <key>`")
    principal = authenticate_cached(scope["app"].state.engine, key)
    if principal is None:
        try:
            principal = await run_in_threadpool(_authenticate, scope, key)
        except (OperationalError, PoolTimeout):
            raise ServiceUnavailable("the database is unavailable; retry later") from None
    if principal is None:
        raise _unauthorized("invalid or revoked API key")
    return principal


def _unauthorized(msg: str) -> Unauthorized:
    return Unauthorized(msg, ("header", "authorization"))


def _authenticate(scope: Scope, key: str) -> Principal | None:
    with transaction(scope["app"].state.engine) as session:
        return authenticate(session, key)
