"""What browsers are told and checked for: hardening headers on every response, and the
same-origin check of the dashboard's cookie-setting forms (login CSRF).

Headers: a Content-Security-Policy (own scripts only, no plugins, no framing by other sites),
``X-Frame-Options`` for browsers without ``frame-ancestors``, ``nosniff``, no Referer to other
sites (portal links carry their token in the path; ``same-origin``, not ``no-referrer``, which
makes browsers send ``Origin: null`` on the dashboard's own forms and so fail the check
below), HSTS when the request came over TLS (``https`` scheme, or ``X-Forwarded-Proto: https``
from the proxy that terminated it), and ``Cache-Control: no-store`` on any response to a
request that carried credentials (an API key or the session cookie), unless the route chose its
own caching.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from fastapi import HTTPException, Request
from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

# Styles may be inline (the pages' bars are sized by style attributes; the invoice HTML is
# one self-contained document); scripts come from this site alone.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)
# Swagger UI and ReDoc (``/docs``, ``/redoc``) start themselves with an inline script.
DOCS_CSP = CSP.replace("script-src 'self'", "script-src 'self' 'unsafe-inline'")
DOCS_PATHS = frozenset({"/docs", "/docs/oauth2-redirect", "/redoc"})
HSTS = "max-age=31536000; includeSubDomains"


class SecurityHeaders:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Headers(scope=scope)
        credentials = "authorization" in request or "cookie" in request
        tls = scope["scheme"] == "https" or request.get("x-forwarded-proto") == "https"
        csp = DOCS_CSP if scope["path"] in DOCS_PATHS else CSP

        async def send_hardened(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                headers.setdefault("Content-Security-Policy", csp)
                headers.setdefault("X-Frame-Options", "DENY")
                headers.setdefault("X-Content-Type-Options", "nosniff")
                headers.setdefault("Referrer-Policy", "same-origin")
                if tls:
                    headers.setdefault("Strict-Transport-Security", HSTS)
                if credentials:
                    headers.setdefault("Cache-Control", "no-store")
            await send(message)

        await self.app(scope, receive, send_hardened)


def same_origin(request: Request, public_url: str | None) -> None:
    """Refuse (403) a form post another site's page made: its Origin (or, without one, its
    Referer) must name this site, by the request's Host or by ``public_url``
    (``GPUMETER_PUBLIC_URL``: behind a proxy that rewrites Host, the site's own pages still
    post). Browsers send one of them with every cross-site POST; a client that sends neither
    is no browser and carries no ambient cookie to abuse."""
    origin = request.headers.get("origin") or request.headers.get("referer")
    if origin is None:
        return
    sent = urlsplit(origin)
    this_site = {("", request.headers.get("host", ""))}
    if public_url:
        public = urlsplit(public_url)
        this_site.add((public.scheme, public.netloc))
    if origin == "null" or not {("", sent.netloc), (sent.scheme, sent.netloc)} & this_site:
        # Neither header is echoed back: the answer says what failed, not what was sent.
        raise HTTPException(403, "a form from another site may not post here: cross-site")
