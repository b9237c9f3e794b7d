"""The HTTP floor of ingest: uvicorn as ``gpumeter serve`` runs it (``uvicorn_options``), with
an app that reads each request's body and answers 200 with an ingest-sized JSON body, doing
nothing else. ``bench/ingest.py --phases floor`` drives it with the rate phase's nodes: the
service CPU a batch costs before any validation or storage, the part no change to ingest's own
code can remove.

Run by the bench as ``python bench/http_floor.py PORT WORKERS``; stops on SIGTERM.
"""

from __future__ import annotations

import sys
from typing import Any

ANSWER = (  # the size of ingest's answer to an 8-GPU batch
    b'{"batch_id":"5f0c2a9e41d7b386","accepted":8,"duplicates":0,'
    b'"events_accepted":0,"events_duplicate":0}'
)
HEADERS = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(ANSWER))]


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    await send({"type": "http.response.body", "body": ANSWER})


def main() -> None:
    import uvicorn

    from app.cli.server import uvicorn_options
    from app.settings import get_settings

    port, workers = int(sys.argv[1]), int(sys.argv[2])
    uvicorn.run(
        "http_floor:app",
        app_dir=str(__file__).rpartition("/")[0],
        host="127.0.0.1",
        port=port,
        workers=workers,
        **uvicorn_options(get_settings()),
    )


if __name__ == "__main__":
    main()
