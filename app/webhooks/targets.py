"""Which URLs a webhook may target: http(s) only, and no loopback, private, link-local or
otherwise internal address unless ``webhook_allow_private`` says so (an SSRF guard).

The host is resolved when the endpoint is registered and again before every delivery, so a
name that later points inside the network is refused too. A delivery connects to the very
address that was checked (``Target.address``; the name goes in the Host header and TLS's SNI),
so a name that resolves elsewhere a moment later (DNS rebinding) cannot redirect it.

IPv6 forms that carry an IPv4 address (IPv4-mapped and -compatible, NAT64, 6to4, Teredo) are
judged by the IPv4 address inside too: ``[64:ff9b::a9fe:a9fe]`` reaches 169.254.169.254 through
a NAT64 gateway.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

Address = ipaddress.IPv4Address | ipaddress.IPv6Address

# NAT64 prefixes: the well-known one (RFC 6052; the IPv4 address is the last 32 bits) and the
# local-use one (RFC 8215), which is the operator's own and never a public destination.
NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
LOCAL_NAT64 = ipaddress.IPv6Network("64:ff9b:1::/48")
IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")  # deprecated ::a.b.c.d (RFC 4291)


class RefusedTarget(ValueError):
    """The URL may not receive webhooks; the message says why."""


@dataclass(frozen=True)
class Target:
    """A checked URL: its host name and the address a delivery connects to."""

    host: str
    port: int
    address: Address


def check_target(url: str, *, allow_private: bool) -> Target:
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
    addresses = _addresses(parts.hostname, port)
    if not allow_private:
        for address in addresses:
            if internal(address):
                raise RefusedTarget(
                    f"{parts.hostname} resolves to {address}, a loopback, private or reserved "
                    "address (set GPUMETER_WEBHOOK_ALLOW_PRIVATE=true to allow it)"
                )
    return Target(parts.hostname, port, min(addresses, key=lambda a: (a.version, a)))


def internal(address: Address) -> bool:
    """Whether the address, or an IPv4 address it embeds, is not a public one."""
    if not address.is_global or address in LOCAL_NAT64:
        return True
    return any(not embedded.is_global for embedded in _embedded_ipv4(address))


def _embedded_ipv4(address: Address) -> list[ipaddress.IPv4Address]:
    if isinstance(address, ipaddress.IPv4Address):
        return []
    low32 = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    embedded = [
        v4
        for v4 in (address.ipv4_mapped, address.sixtofour, *(address.teredo or ()))
        if v4 is not None
    ]
    if address in NAT64 or address in IPV4_COMPATIBLE:
        embedded.append(low32)
    return embedded


def _addresses(host: str, port: int) -> set[Address]:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        raise RefusedTarget(f"the host {host} does not resolve") from None
    return {ipaddress.ip_address(info[4][0]) for info in infos}
