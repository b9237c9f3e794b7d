"""Authentication dependencies: every /v1 route declares which principals it admits."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import Engine
from starlette.concurrency import run_in_threadpool

from app.auth.models import KeyKind
from app.auth.service import Principal, authenticate, authenticate_cached
from app.core.db import transaction
from app.core.deps import AppSettings, DbSession
from app.core.errors import Forbidden, Unauthorized

_bearer = HTTPBearer(auto_error=False, description="An API key: `Authorization: Bearer gm_...`")
# The `Authorization: Bearer` credentials, if the request sent any.
BearerCredentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


def current_principal(
    request: Request,
    session: DbSession,
    credentials: BearerCredentials,
) -> Principal:
    cookie_principal = _cookie_principal(request)
    if cookie_principal is not None:
        return cookie_principal
    return _known(authenticate(session, _bearer_key(credentials)))


async def _principal(request: Request, credentials: BearerCredentials) -> Principal:
    """``current_principal`` for the routes: on the event loop, without the request's session,
    so a key found in memory (``app.auth.cache``) costs no thread hop and no query; a miss
    is looked up in a thread, in a short transaction of its own."""
    cookie_principal = _cookie_principal(request)
    if cookie_principal is not None:
        return cookie_principal
    return _known(await key_principal(request.app.state.engine, _bearer_key(credentials)))


async def key_principal(engine: Engine, key: str) -> Principal | None:
    """The key's principal, None for an unknown or revoked key: from memory when this process
    holds it, else looked up in a thread, in a short transaction of its own."""
    principal = authenticate_cached(engine, key)
    if principal is None:
        principal = await run_in_threadpool(_authenticate, engine, key)
    return principal


def _cookie_principal(request: Request) -> Principal | None:
    # The dashboard signs customers in with a session cookie; it sets this for its requests.
    principal: Principal | None = getattr(request.state, "principal", None)
    return principal


def _bearer_key(credentials: HTTPAuthorizationCredentials | None) -> str:
    if credentials is None:
        raise Unauthorized(
            "missing API key: send `Authorization: Bearer <key>`", ("header", "authorization")
        )
    return credentials.credentials


def _known(principal: Principal | None) -> Principal:
    if principal is None:
        raise Unauthorized("invalid or revoked API key", ("header", "authorization"))
    return principal


def _authenticate(engine: Engine, key: str) -> Principal | None:
    with transaction(engine) as session:
        return authenticate(session, key)


def require_kind(principal: Principal, *kinds: KeyKind) -> Principal:
    """The principal, if its key is of one of these kinds; else 403."""
    if principal.kind not in kinds:
        wanted = " or ".join(kind.value for kind in kinds)
        raise Forbidden(f"this endpoint needs a {wanted} key", ("header", "authorization"))
    return principal


def _require(*kinds: KeyKind) -> Callable[[Principal], Coroutine[Any, Any, Principal]]:
    async def dependency(principal: Annotated[Principal, Depends(_principal)]) -> Principal:
        return require_kind(principal, *kinds)

    return dependency


# Console reads: admins see everything, customer keys only their own customer's objects
# (endpoints scope them and answer 404 for anything else). Node tokens only ingest.
ConsoleUser = Annotated[Principal, Depends(_require(KeyKind.ADMIN, KeyKind.CUSTOMER))]
Admin = Annotated[Principal, Depends(_require(KeyKind.ADMIN))]
NodeAgent = Annotated[Principal, Depends(_require(KeyKind.NODE))]
# A scheduler adapter (gpumeter-slurm): its snapshots, actions and their outcomes; admins too.
SchedulerAdapter = Annotated[Principal, Depends(_require(KeyKind.ADMIN, KeyKind.SCHEDULER))]


async def metrics_reader(
    request: Request, credentials: BearerCredentials, settings: AppSettings
) -> None:
    """``GET /metrics`` takes an admin key unless ``metrics_public`` opens it: its series
    (queues, failovers per datacenter and model) describe the whole provider."""
    if not settings.metrics_public:
        require_kind(await _principal(request, credentials), KeyKind.ADMIN)
