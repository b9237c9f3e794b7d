"""One kept-alive HTTP(S) connection to the service, gzip request bodies.

- The connection (``http.client``) is opened on the first request and reused for the next ones,
  so an upload round costs one request, not a TCP (and TLS) handshake too. Any error closes it;
  the next request opens a new one.
- A request that fails on a *reused* connection before any reply arrived (the service, or a
  proxy, closed the idle connection: reset, broken pipe, ``RemoteDisconnected``) is sent once
  more on a fresh connection. Ingest is idempotent (batch ids, GPU and second), so a batch that
  did reach the service is only counted as a duplicate.
- Bounded waits: ``timeout_s`` applies to connecting and to every socket read and write, and the
  reply body read is capped at ``MAX_REPLY_BYTES``.
- Bodies are gzip'd (``Content-Encoding: gzip``); the service decodes them with a bound on the
  decompressed size. Level 6: JSON batches shrink about 8x for little CPU (bench/agent.py).
"""

from __future__ import annotations

import gzip
import http.client
import ssl
import urllib.parse
from dataclasses import dataclass

GZIP_LEVEL = 6
MAX_REPLY_BYTES = 64 * 1024  # an ingest reply is a few hundred bytes; errors list items


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    headers: http.client.HTTPMessage
    body: bytes


class Transport:
    def __init__(self, url: str, *, timeout_s: float, compress: bool = True) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"server URL must be http(s)://host[:port], not {url!r}")
        self._https = parts.scheme == "https"
        self._host, self._port = parts.hostname, parts.port
        self.path = parts.path or "/"
        self.timeout_s = timeout_s
        self.compress = compress
        self._conn: http.client.HTTPConnection | None = None
        self.connections_opened = 0  # for metrics and tests: one per (re)connect

    def _connection(self) -> tuple[http.client.HTTPConnection, bool]:
        """The open connection (reused: True) or a new one."""
        if self._conn is not None:
            return self._conn, True
        if self._https:
            context = ssl.create_default_context()
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                self._host, self._port, timeout=self.timeout_s, context=context
            )
        else:
            conn = http.client.HTTPConnection(self._host, self._port, timeout=self.timeout_s)
        self._conn = conn
        self.connections_opened += 1
        return conn, False

    def encode(self, body: bytes) -> tuple[bytes, dict[str, str]]:
        """The body as sent, and the headers that describe it."""
        if not self.compress:
            return body, {"Content-Type": "application/json"}
        packed = gzip.compress(body, compresslevel=GZIP_LEVEL, mtime=0)
        return packed, {"Content-Type": "application/json", "Content-Encoding": "gzip"}

    def post(self, body: bytes, headers: dict[str, str]) -> Response:
        """POST ``body`` (already encoded) to the URL's path; raises OSError or
        ``http.client.HTTPException`` when no reply came."""
        conn, reused = self._connection()
        try:
            return self._exchange(conn, body, headers)
        except (ConnectionError, http.client.RemoteDisconnected, http.client.BadStatusLine):
            self.close()
            if not reused:
                raise
        except (OSError, http.client.HTTPException):
            self.close()
            raise
        # The service closed the idle connection under us: once more, on a new one.
        conn, _ = self._connection()
        try:
            return self._exchange(conn, body, headers)
        except (OSError, http.client.HTTPException):
            self.close()
            raise

    def _exchange(
        self, conn: http.client.HTTPConnection, body: bytes, headers: dict[str, str]
    ) -> Response:
        conn.request("POST", self.path, body=body, headers=headers)
        reply = conn.getresponse()
        data = reply.read(MAX_REPLY_BYTES)
        if reply.will_close or not reply.isclosed():  # closed by the server, or not read whole
            self.close()
        return Response(reply.status, reply.headers, data)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
