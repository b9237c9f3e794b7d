"""Errors with one body shape everywhere: ``{"detail": [{"loc": [...], "msg": ..., "type": ...}]}``.

This is FastAPI's own validation-error shape, so a client parses every 4xx the same way and
always learns what is wrong and where.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from sqlalchemy.exc import DataError, DBAPIError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import compile_path

log = logging.getLogger(__name__)

Loc = Sequence[str | int]

# The largest Postgres BIGINT: every integer id, cursor and cent amount the API takes is
# range-checked against it where it enters, so none reaches the database out of range.
BIGINT_MAX = 2**63 - 1


class ApiError(Exception):
    status_code = 400
    error_type = "bad_request"

    def __init__(self, msg: str, loc: Loc = (), *, extra: dict[str, Any] | None = None) -> None:
        super().__init__(msg)
        self.items = [{"loc": list(loc), "msg": msg, "type": self.error_type, **(extra or {})}]

    @classmethod
    def many(cls, items: list[dict[str, Any]]) -> ApiError:
        """One error listing several problems, each a dict with at least ``loc`` and ``msg``."""
        error = cls(items[0]["msg"], items[0]["loc"])
        error.items = [{"type": cls.error_type, **item} for item in items]
        return error


class Unauthorized(ApiError):
    status_code = 401
    error_type = "unauthorized"


class Forbidden(ApiError):
    status_code = 403
    error_type = "forbidden"


class NotFound(ApiError):
    status_code = 404
    error_type = "not_found"


class Conflict(ApiError):
    status_code = 409
    error_type = "conflict"


class Unprocessable(ApiError):
    status_code = 422
    error_type = "unprocessable"


class PayloadTooLarge(ApiError):
    status_code = 413
    error_type = "payload_too_large"


# What a request cut short by the service stopping is told (a 503: retry elsewhere or later).
SHUTTING_DOWN = "the service is shutting down; retry later"


class ServiceUnavailable(ApiError):
    status_code = 503
    error_type = "unavailable"


class TooManyRequests(ApiError):
    status_code = 429
    error_type = "too_many_requests"
    retry_after_s = 1

    @classmethod
    def after(cls, seconds: int) -> TooManyRequests:
        error = cls(
            f"too many failed authentications from this address or for this key; retry in "
            f"{seconds} s",
            ("header", "authorization"),
        )
        error.retry_after_s = seconds
        return error


# Seconds a shed or database-less request should wait before it is re-sent.
RETRY_AFTER_S = 1


class ErrorItem(BaseModel):
    loc: list[str | int]
    msg: str
    type: str


class ErrorBody(BaseModel):
    """Every 4xx and 503 body."""

    detail: list[ErrorItem]


_MEANINGS = {
    400: "the body is not JSON (or not UTF-8)",
    401: "missing, invalid or revoked credentials",
    403: "the credentials may not do this",
    404: "no such object, or not one the caller may see",
    409: "conflicts with stored state; each conflict is listed",
    413: "the request body or batch is too large",
    422: "invalid input, each problem listed with where it is",
    429: "too many failed authentications; retry after `Retry-After` seconds",
    503: "overloaded or the database is unreachable; retry after `Retry-After` seconds",
}


def error_responses(*codes: int, **meanings: str) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses=`` for these error statuses, all in the one error shape; a route
    may give a status its own meaning (``_409="..."``)."""
    return {
        code: {"model": ErrorBody, "description": meanings.get(f"_{code}", _MEANINGS[code])}
        for code in codes
    }


_PUBLIC_PATHS = frozenset({"/healthz", "/readyz", "/v1/stripe/webhook"})
_BODY_METHODS = frozenset({"post", "put", "patch"})


# Where an OpenAPI document's schemas live; pydantic's ``ref_template`` for them.
COMPONENT_REF = "#/components/schemas/{model}"


def add_component(schema: dict[str, Any], name: str, definition: dict[str, Any]) -> None:
    """Put a JSON schema (made with ``COMPONENT_REF``) and the schemas it nests into an
    OpenAPI document's components."""
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components.update(definition.pop("$defs", {}))
    components[name] = definition


def document_errors(
    app: FastAPI, served_elsewhere: Callable[[dict[str, Any]], None] | None = None
) -> None:
    """Add the error statuses every operation can answer to the OpenAPI: 401/403/429 when it
    is authenticated, 404 with a path parameter, 400/404/409/413 with a body (not JSON, naming a
    missing object, a conflict with stored state, too large), 422 with any input, 503 always
    (shed or database down).
    An operation's own ``responses=`` meanings win. ``served_elsewhere`` first adds the
    operations served outside FastAPI's routing (which documents only its own routes)."""
    plain_openapi = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = plain_openapi()
        if served_elsewhere is not None:
            served_elsewhere(schema)
        add_component(schema, "ErrorBody", ErrorBody.model_json_schema(ref_template=COMPONENT_REF))
        for path, operations in schema["paths"].items():
            for method, operation in operations.items():
                _add_errors(path, method, operation)
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


def _add_errors(path: str, method: str, operation: dict[str, Any]) -> None:
    params = operation.get("parameters", [])
    codes = {503}
    if path not in _PUBLIC_PATHS:
        codes |= {401, 403, 429}
    if any(p["in"] == "path" for p in params):
        codes.add(404)
    if method in _BODY_METHODS:  # a body may name other objects too (404)
        codes |= {400, 404, 409, 413}
    if params or "requestBody" in operation:
        codes.add(422)
    ref = {"$ref": "#/components/schemas/ErrorBody"}
    for code in sorted(codes):
        operation["responses"].setdefault(
            str(code),
            {"description": _MEANINGS[code], "content": {"application/json": {"schema": ref}}},
        )


def unavailable_response(msg: str) -> JSONResponse:
    return api_error_response(ServiceUnavailable(msg))


def error_headers(exc: ApiError) -> dict[str, str]:
    """A 401 names the scheme to authenticate with; a 503 and a 429 say when to retry."""
    if exc.status_code == 401:
        return {"WWW-Authenticate": "Bearer"}
    if exc.status_code == 503:
        return {"Retry-After": str(RETRY_AFTER_S)}
    if isinstance(exc, TooManyRequests):
        return {"Retry-After": str(exc.retry_after_s)}
    return {}


def api_error_response(exc: ApiError) -> JSONResponse:
    return JSONResponse(
        {"detail": exc.items}, status_code=exc.status_code, headers=error_headers(exc)
    )


def database_unavailable(exc: Exception, path: str) -> ServiceUnavailable | None:
    """The 503 a database failure is answered with, logged: no pooled connection in time, a
    connection lost or refused, or a statement the server cancelled (a timeout); the state of
    the database, not the request's fault, so the client retries. None for any other error."""
    if isinstance(exc, PoolTimeout):
        log.warning("no database connection in time", extra={"path": path})
        return ServiceUnavailable("the service is overloaded; retry later")
    if isinstance(exc, DBAPIError) and (
        exc.connection_invalidated or isinstance(exc, OperationalError)
    ):
        log.warning("database unavailable", extra={"path": path, "error": str(exc)})
        return ServiceUnavailable("the database is unavailable; retry later")
    return None


def data_error(exc: DataError) -> Unprocessable:
    """The 422 for a value the database refused as out of its type's range or form (a
    backstop: inputs are range-checked where they enter), with Postgres's own reason."""
    diag = getattr(exc.orig, "diag", None)
    reason = getattr(diag, "message_primary", None) or "a value is out of range"
    log.warning("database refused a value", extra={"error": reason})
    return Unprocessable(f"a value the database cannot store: {reason}")


def not_found(what: str, ident: object, loc: Loc = ("path", "id")) -> NotFound:
    return NotFound(f"{what} {ident} not found", loc)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return api_error_response(exc)

    @app.exception_handler(DBAPIError)
    @app.exception_handler(PoolTimeout)
    async def _database_error(request: Request, exc: Exception) -> JSONResponse:
        if isinstance(exc, DataError):  # a value the database cannot hold: the input's fault
            return api_error_response(data_error(exc))
        unavailable = database_unavailable(exc, request.url.path)
        if unavailable is None:
            raise exc
        return api_error_response(unavailable)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        items = [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]} for e in exc.errors()]
        return JSONResponse({"detail": items}, status_code=422)

    # Anything else: the API's error shape, not Starlette's plain text (which it sends and then
    # re-raises the error, so the server logs it with its traceback).
    app.add_exception_handler(Exception, internal_error)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        items = [{"loc": [], "msg": str(exc.detail), "type": "http_error"}]
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            headers["Allow"] = ", ".join(allowed_methods(request))
        return JSONResponse({"detail": items}, status_code=exc.status_code, headers=headers)


INTERNAL_ERROR = "an unexpected error; it has been logged for the operators: retry, or report it"


async def internal_error(request: Request, exc: Exception) -> JSONResponse:
    """The 500 of an error nothing else handled, in the one error shape. Not logged here:
    Starlette's ServerErrorMiddleware re-raises it after the answer, and the server logs it
    once, with its traceback (app.main wraps a second one around ingest and the throttle,
    which would log it twice)."""
    items = [{"loc": [], "msg": INTERNAL_ERROR, "type": "internal_error"}]
    return JSONResponse({"detail": items}, status_code=500)


def allowed_methods(request: Request) -> list[str]:
    """Every method the API serves on this path. Starlette names only those of the first
    route matching the path, but GET and PATCH of one resource are separate routes."""
    app = request.app
    templates = getattr(app.state, "path_methods", None)
    if templates is None:
        templates = [
            (compile_path(path)[0], path, [m.upper() for m in operations])
            for path, operations in app.openapi()["paths"].items()
        ]
        app.state.path_methods = templates
    path = request.url.path
    matching = [(t.count("{"), methods) for regex, t, methods in templates if regex.match(path)]
    fewest = min((n for n, _ in matching), default=0)  # a literal path beats a parameter
    return sorted({m for n, methods in matching if n == fewest for m in methods})
