from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from sqlalchemy.exc import SQLAlchemyError

from app.core.migrate import is_up_to_date

router = APIRouter(tags=["operations"])


@router.get("/healthz")
def healthz() -> dict[str, str]:
    """The process is alive."""
    return {"status": "ok"}


@router.get("/readyz", responses={503: {"description": "database unreachable or not migrated"}})
def readyz(request: Request) -> JSONResponse:
    """The database is reachable and migrated to the code's head revision."""
    try:
        migrated = is_up_to_date(request.app.state.engine)
    except SQLAlchemyError as error:
        reason = f"database unreachable: {type(error).__name__}"
        return JSONResponse({"status": "unavailable", "reason": reason}, status_code=503)
    if not migrated:
        reason = "database schema is not at the head revision; run `gpumeter db upgrade`"
        return JSONResponse({"status": "unavailable", "reason": reason}, status_code=503)
    return JSONResponse({"status": "ready"})
