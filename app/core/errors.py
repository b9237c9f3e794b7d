"""Errors with one body shape everywhere: ``{"detail": [{"loc": [...], "msg": ..., "type": ...}]}``.

This is FastAPI's own validation-error shape, so a client parses every 4xx the same way and
always learns what is wrong and where.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

Loc = Sequence[str | int]


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


def not_found(what: str, ident: object, loc: Loc = ("path", "id")) -> NotFound:
    return NotFound(f"{what} {ident} not found", loc)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status_code == 401 else None
        return JSONResponse({"detail": exc.items}, status_code=exc.status_code, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        items = [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]} for e in exc.errors()]
        return JSONResponse({"detail": items}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        items = [{"loc": [], "msg": str(exc.detail), "type": "http_error"}]
        return JSONResponse({"detail": items}, status_code=exc.status_code, headers=exc.headers)
