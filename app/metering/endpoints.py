from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Coroutine
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request, Response
from fastapi.routing import APIRoute

from app.auth.deps import NodeAgent
from app.core.errors import ApiError, PayloadTooLarge
from app.metering import service
from app.metering.group_commit import GroupCommit
from app.settings import get_settings
from metering_agent.protocol import INGEST_PATH, IngestBatch, IngestResult

IDENTITY = frozenset({"", "identity"})
GZIP = frozenset({"gzip", "x-gzip"})
GZIP_WBITS = 16 + zlib.MAX_WBITS  # a gzip header and trailer around the deflate stream


class UnsupportedEncoding(ApiError):
    status_code = 415
    error_type = "unsupported_media_type"


def decode_body(data: bytes, encoding: str, limit: int) -> bytes:
    """A ``Content-Encoding: gzip`` body, inflated to at most ``limit`` bytes: a body that
    inflates past it (a gzip bomb) is refused before more than ``limit + 1`` bytes exist."""
    if encoding not in GZIP:
        raise UnsupportedEncoding(
            f"Content-Encoding {encoding!r} is not supported; send gzip or identity",
            ["header", "content-encoding"],
        )
    inflater = zlib.decompressobj(wbits=GZIP_WBITS)
    try:
        body = inflater.decompress(data, limit + 1)
    except zlib.error as e:
        raise ApiError(f"the body is not valid gzip: {e}", ["body"]) from e
    if len(body) > limit:
        raise PayloadTooLarge(
            f"the gzip body inflates to more than the limit of {limit} bytes", ["body"]
        )
    if not inflater.eof:
        raise ApiError("the gzip body is truncated", ["body"])
    if inflater.unused_data:
        raise ApiError("the gzip body has data after its end", ["body"])
    return body


class _DecodedRequest(Request):
    def __init__(self, request: Request, body: bytes) -> None:
        super().__init__(request.scope, request.receive)
        self._body = body


class DecodingRoute(APIRoute):
    """Inflates a gzip request body before FastAPI parses it, so the route's schema, validation
    and errors are those of the plain JSON body."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def decoding_handler(request: Request) -> Response:
            encoding = request.headers.get("content-encoding", "").strip().lower()
            if encoding not in IDENTITY:
                limit = get_settings().max_body_bytes
                request = _DecodedRequest(
                    request, decode_body(await request.body(), encoding, limit)
                )
            return await handler(request)

        return decoding_handler


router = APIRouter(tags=["metering"], route_class=DecodingRoute)

_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"description": "the body is not JSON, or not valid gzip (Content-Encoding: gzip)"},
    403: {"description": "a record or event names a GPU registered to another node"},
    409: {"description": "records contradict stored seconds; each conflict is listed"},
    413: {
        "description": "more records plus events than the batch limit, or a body (inflated"
        " from gzip) larger than the body limit"
    },
    415: {"description": "a Content-Encoding other than gzip or identity"},
    422: {"description": "invalid items, each listed by index and field"},
}


async def group_commit(request: Request) -> GroupCommit:
    """Ingest's writers, as the composition root (``app.main.create_app``) made them (async:
    a plain function would cost the request a thread hop)."""
    writers: GroupCommit = request.app.state.ingest_writers
    return writers


@router.post(INGEST_PATH, responses=_ERRORS)
async def ingest(
    batch: IngestBatch,
    node: NodeAgent,
    writers: Annotated[GroupCommit, Depends(group_commit)],
) -> IngestResult:
    """Store a node agent's batch of usage records and health events, whole or not at all.

    Re-sent records and events are counted as duplicates and change nothing. The body may be
    gzip'd (``Content-Encoding: gzip``); inflated, it is bounded like any body.
    """
    assert node.node_id is not None  # node keys always carry their node
    service.check_batch(batch, get_settings(), int(time.time()))
    return await writers.store(node.node_id, batch)
