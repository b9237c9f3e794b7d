"""``POST /v1/ingest``, served as a plain ASGI app ahead of FastAPI's stack (``app.main``).

Ingest is most of a service's requests: every node uploads every few seconds. Through
FastAPI each paid for eight middleware layers, routing, dependency solving and the body's
parse into dicts before validation: over a third of a worker's CPU at full load. Here a
request passes the same request limits (``RequestLimits``, with in-flight slots of its
own, ``ingest_in_flight``) and the same key check (``bearer_principal``), then its body is
validated straight from JSON bytes by pydantic-core and handed to the group-commit writers.
Its answers and errors are those of the rest of the API (``app.core.errors``); OpenAPI
lists it (``document``).
"""

from __future__ import annotations

import inspect
import time
import uuid
import zlib
from typing import Any

import msgspec
from pydantic import TypeAdapter, ValidationError
from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect, Request
from starlette.types import Receive, Scope, Send

from app.auth.deps import require_kind
from app.auth.middleware import bearer_principal
from app.auth.models import KeyKind
from app.core.errors import (
    COMPONENT_REF,
    ApiError,
    PayloadTooLarge,
    Unprocessable,
    add_component,
    database_unavailable,
)
from app.core.limits import send_api_error, send_error
from app.metering import service
from app.metering.group_commit import GroupCommit
from app.settings import Settings
from metering_agent.protocol import INGEST_PATH, IngestBatch, IngestResult

IDENTITY = frozenset({"", "identity"})
GZIP = frozenset({"gzip", "x-gzip"})
GZIP_WBITS = 16 + zlib.MAX_WBITS  # a gzip header and trailer around the deflate stream
_BATCH = TypeAdapter(IngestBatch)
_DECODER = msgspec.json.Decoder(IngestBatch)
_RESULT = TypeAdapter(IngestResult)


class UnsupportedMediaType(ApiError):
    status_code = 415
    error_type = "unsupported_media_type"


def decode_body(data: bytes, encoding: str, limit: int) -> bytes:
    """A ``Content-Encoding: gzip`` body, inflated to at most ``limit`` bytes: a body that
    inflates past it (a gzip bomb) is refused before more than ``limit + 1`` bytes exist."""
    if encoding not in GZIP:
        raise UnsupportedMediaType(
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


class IngestEndpoint:
    """Store a node agent's batch of usage records and health events, whole or not at all,
    but for the items of GPUs whose UUID another node claims too: those are held until an
    operator settles the clash (or refused, once it is settled against this node), each
    answered in ``not_stored``, and the rest of the batch is stored.

    Re-sent records and events are counted as duplicates and change nothing. The body may be
    gzip'd (``Content-Encoding: gzip``); inflated, it is bounded like any body.
    """

    def __init__(self, writers: GroupCommit, settings: Settings) -> None:
        self.writers = writers
        self.settings = settings  # the composition root's (app.main)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] != "POST":
            await send_error(
                send, 405, "Method Not Allowed", "http_error", headers={"Allow": "POST"}
            )
            return
        try:
            node_id = await _node_of(scope)
        except ApiError as error:
            await send_api_error(send, error)  # the body stays unread: close
            return
        request = Request(scope, receive)
        try:
            data = await request.body()
        except ClientDisconnect:
            return  # the client left, or the limits refused the body and answered
        try:
            result = await self._ingest(node_id, request.headers, data)
        except ApiError as error:
            await send_api_error(send, error, close=False)
            return
        except Exception as error:
            unavailable = database_unavailable(error, INGEST_PATH)
            if unavailable is None:
                raise
            await send_api_error(send, unavailable, close=False)
            return
        body = msgspec.json.encode(result)  # the JSON of _RESULT's schema, in a third the time
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def _ingest(self, node_id: uuid.UUID, headers: Headers, data: bytes) -> IngestResult:
        return await self.writers.store(node_id, self.parse(headers, data))

    def parse(self, headers: Headers, data: bytes) -> IngestBatch:
        """The checked batch of a request's body; what is wrong with it raises (4xx)."""
        settings = self.settings
        encoding = headers.get("content-encoding", "").strip().lower()
        if encoding not in IDENTITY:
            data = decode_body(data, encoding, settings.max_body_bytes)
        _check_json(headers.get("content-type"))
        batch = decode_batch(data)
        service.check_batch(batch, settings, int(time.time()))
        return batch


def decode_batch(data: bytes) -> IngestBatch:
    """The batch a JSON body holds, typed as the protocol says; a body that is not one raises,
    listing every problem (index and field).

    msgspec decodes a well-formed body straight into the protocol's dataclasses, in less than
    half of pydantic-core's time (``bench/ingest_cpu.py``). It is the stricter of the two (no
    ``"5"`` for 5, and it stops at the first problem), so a body it refuses is read again by
    pydantic, which accepts what the service always accepted and words every problem as the
    rest of the API does."""
    try:
        return _DECODER.decode(data)
    except msgspec.DecodeError:
        pass
    try:
        return _BATCH.validate_json(data)
    except ValidationError as e:
        raise Unprocessable.many(
            [{"loc": ["body", *i["loc"]], "msg": i["msg"], "type": i["type"]} for i in e.errors()]
        ) from None


async def _node_of(scope: Scope) -> uuid.UUID:
    principal = require_kind(await bearer_principal(scope), KeyKind.NODE)
    assert principal.node_id is not None  # node keys always carry their node
    return principal.node_id


def _check_json(content_type: str | None) -> None:
    """No type, or JSON (``application/json``, ``application/*+json``), as FastAPI reads."""
    if content_type is None:
        return
    media = content_type.partition(";")[0].strip().lower()
    if media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    ):
        return
    raise UnsupportedMediaType(
        f"Content-Type {content_type!r} is not supported; send application/json",
        ["header", "content-type"],
    )


_ERRORS: dict[str, dict[str, Any]] = {
    "400": {"description": "the body is not JSON, or not valid gzip (Content-Encoding: gzip)"},
    "403": {
        "description": "not a node key, or the batch would register more GPUs to its node than"
        " GPUMETER_MAX_GPUS_PER_NODE"
    },
    "409": {"description": "records contradict stored seconds; each conflict is listed"},
    "413": {
        "description": "more records plus events than the batch limit, or a body (inflated"
        " from gzip) larger than the body limit"
    },
    "415": {
        "description": "a Content-Encoding other than gzip or identity, or a Content-Type"
        " other than JSON"
    },
    "422": {"description": "invalid items, each listed by index and field"},
}


def document(schema: dict[str, Any]) -> None:
    """Add the ingest operation and its schemas to the service's OpenAPI document."""
    add_component(
        schema, "IngestBatch", _BATCH.json_schema(ref_template=COMPONENT_REF, mode="validation")
    )
    add_component(
        schema,
        "IngestResult",
        _RESULT.json_schema(ref_template=COMPONENT_REF, mode="serialization"),
    )
    ref = COMPONENT_REF.format
    schema["paths"][INGEST_PATH] = {
        "post": {
            "tags": ["metering"],
            "summary": "Ingest",
            "description": inspect.cleandoc(IngestEndpoint.__doc__ or ""),
            "operationId": "ingest_v1_ingest_post",
            "requestBody": {
                "content": {"application/json": {"schema": {"$ref": ref(model="IngestBatch")}}},
                "required": True,
            },
            "responses": {
                "200": {
                    "description": "Successful Response",
                    "content": {
                        "application/json": {"schema": {"$ref": ref(model="IngestResult")}}
                    },
                },
                **_ERRORS,
            },
            "security": [{"HTTPBearer": []}],
        }
    }
