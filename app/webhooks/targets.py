"""Which URLs a webhook may target: http(s) only, and only global unicast addresses unless
``webhook_allow_private`` says so (an SSRF guard): no loopback, private, link-local, multicast,
reserved or otherwise internal one.

Global unicast is an allow-list, not a list of what to refuse: an IPv6 address must lie in
the global unicast block 2000::/3 (RFC 4291), so whatever lies outside it is refused whatever
Python's ``is_global`` says of it: SIIT's IPv4-translated ``::ffff:0:a.b.c.d`` (RFC 6145) and the
IPv4-mapped ``::ffff:a.b.c.d``, the deprecated site-local fec0::/10, multicast ff00::/8 and
the reserved rest of ::/3 and 4000::/2. Inside it and in IPv4, the special-purpose registry's
non-global blocks (``is_global``) and multicast are refused too.

The host is resolved when the endpoint is registered and again before every delivery, so a
name that later points inside the network is refused too. A delivery connects to the very
address that was checked (``Target.address``; the name goes in the Host header and TLS's SNI),
so a name that resolves elsewhere a moment later (DNS rebinding) cannot redirect it.

IPv6 forms that carry an IPv4 address inside global unicast (6to4, Teredo) and the well-known
NAT64 prefix are judged by the IPv4 address inside too: ``[64:ff9b::a9fe:a9fe]`` reaches
169.254.169.254 through a NAT64 gateway.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

Address = ipaddress.IPv4Address | ipaddress.IPv6Address

# The well-known NAT64 prefix (RFC 6052; the IPv4 address is the last 32 bits): outside
# 2000::/3, but a DNS64 resolver answers it for public IPv4 hosts, so it is judged by that.
# The local-use one (RFC 8215, 64:ff9b:1::/48) is the operator's own: refused.
NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
GLOBAL_UNICAST = ipaddress.IPv6Network("2000::/3")
# Not global, though Python 3.11's ``is_global`` predates it: documentation (RFC 9637).
DOCUMENTATION = ipaddress.IPv6Network("3fff::/20")


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
                    f"{parts.hostname} resolves to {address}, not a global unicast address "
                    "(a loopback, private, multicast or reserved one; set "
                    "GPUMETER_WEBHOOK_ALLOW_PRIVATE=true to allow it)"
                )
    return Target(parts.hostname, port, min(addresses, key=lambda a: (a.version, a)))


def internal(address: Address) -> bool:
    """Whether the address, or an IPv4 address it embeds, is not a global unicast one."""
    if isinstance(address, ipaddress.IPv4Address):
        return not _global_unicast_v4(address)
    if address in NAT64:  # a public IPv4 address through the well-known NAT64 prefix
        return not _global_unicast_v4(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
    if address not in GLOBAL_UNICAST or address in DOCUMENTATION or not address.is_global:
        return True
    return any(not _global_unicast_v4(embedded) for embedded in _embedded_ipv4(address))


def _global_unicast_v4(address: ipaddress.IPv4Address) -> bool:
    return address.is_global and not address.is_multicast


def _embedded_ipv4(address: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses a global unicast IPv6 address carries (6to4, Teredo)."""
    return [v4 for v4 in (address.sixtofour, *(address.teredo or ())) if v4 is not None]


def _addresses(host: str, port: int) -> set[Address]:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        raise RefusedTarget(f"the host {host} does not resolve") from None
    return {ipaddress.ip_address(info[4][0]) for info in infos}
