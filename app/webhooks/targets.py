"""Which URLs a webhook may target: http(s) only, and no loopback, private, link-local or
otherwise internal address unless ``webhook_allow_private`` says so (an SSRF guard).

The host is resolved when the endpoint is registered and again before every delivery, so a
name that later points inside the network is refused too.
"""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit


class RefusedTarget(ValueError):
    """The URL may not receive webhooks; the message says why."""


def check_target(url: str, *, allow_private: bool) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise RefusedTarget("only http and https URLs can receive webhooks")
    if not parts.hostname:
        raise RefusedTarget("the URL has no host")
    if parts.username or parts.password:
        raise RefusedTarget("credentials in the URL are not allowed; put them in the path")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise RefusedTarget("the URL's port is not a number from 0 to 65535") from None
    if allow_private:
        return
    for address in _addresses(parts.hostname, port):
        if not address.is_global:
            raise RefusedTarget(
                f"{parts.hostname} resolves to {address}, a loopback, private or reserved "
                "address (set GPUMETER_WEBHOOK_ALLOW_PRIVATE=true to allow it)"
            )


def _addresses(host: str, port: int) -> set[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        raise RefusedTarget(f"the host {host} does not resolve") from None
    return {ipaddress.ip_address(info[4][0]) for info in infos}
