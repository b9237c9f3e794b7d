"""Authentication dependencies: every /v1 route declares which principals it admits."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from app.auth.models import KeyKind
from app.auth.service import Principal, authenticate
from app.core.deps import DbSession
from app.core.errors import Forbidden, Unauthorized

_bearer = HTTPBearer(auto_error=False, description="An API key: `Authorization: Bearer gm_...`")
# The `Authorization: Bearer` credentials, if the request sent any.
BearerCredentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


def current_principal(
    request: Request,
    session: DbSession,
    credentials: BearerCredentials,
) -> Principal:
    # The dashboard signs customers in with a session cookie; it sets this for its requests.
    cookie_principal: Principal | None = getattr(request.state, "principal", None)
    if cookie_principal is not None:
        return cookie_principal
    if credentials is None:
        raise Unauthorized(
            "missing API key: send `Authorization: Bearer <key>`", ("header", "authorization")
        )
    principal = authenticate(session, credentials.credentials)
    if principal is None:
        raise Unauthorized("invalid or revoked API key", ("header", "authorization"))
    return principal


def _require(*kinds: KeyKind) -> Callable[[Principal], Principal]:
    wanted = " or ".join(kind.value for kind in kinds)

    def dependency(principal: Annotated[Principal, Depends(current_principal)]) -> Principal:
        if principal.kind not in kinds:
            raise Forbidden(f"this endpoint needs a {wanted} key", ("header", "authorization"))
        return principal

    return dependency


# Console reads: admins see everything, customer keys only their own customer's objects
# (endpoints scope them and answer 404 for anything else). Node tokens only ingest.
ConsoleUser = Annotated[Principal, Depends(_require(KeyKind.ADMIN, KeyKind.CUSTOMER))]
Admin = Annotated[Principal, Depends(_require(KeyKind.ADMIN))]
NodeAgent = Annotated[Principal, Depends(_require(KeyKind.NODE))]
