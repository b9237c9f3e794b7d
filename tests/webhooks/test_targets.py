"""A delivery connects to the address its check resolved: a name that resolves elsewhere a
moment later (DNS rebinding) cannot redirect it."""

from __future__ import annotations

import ipaddress
import socket
from datetime import UTC, datetime
from typing import Any

import pytest

from app.settings import Settings
from app.webhooks import signing
from app.webhooks.delivery import Request, send
from app.webhooks.targets import internal
from tests.webhooks.receiver import Receiver

NAME = "hooks.rebinding.test"


def test_a_delivery_goes_to_the_address_that_was_checked(
    settings: Settings, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = socket.getaddrinfo
    answers = ["127.0.0.1"]  # the first lookup (the check); every later one: elsewhere

    def rebinding(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host != NAME:
            return real(host, port, *args, **kwargs)
        address = answers.pop() if answers else "127.0.0.2"  # nothing listens there
        return real(address, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    secret = signing.new_secret()
    receiver.secrets["/hook"] = secret
    url = f"http://{NAME}:{receiver.port}/hook"
    request = Request(url, '{"n": 1}', "msg_1", [secret], datetime.now(UTC))

    outcome = send(request, settings)

    assert (outcome.status_code, outcome.error) == (204, None)
    [delivery] = receiver.received
    assert (delivery.message_id, delivery.host) == ("msg_1", f"{NAME}:{receiver.port}")


@pytest.mark.parametrize(
    "address",
    # public IPv4, IPv6 global unicast, a public IPv4 through NAT64 and inside 6to4
    ["8.8.8.8", "2001:4860:4860::8888", "2606:4700::1111", "64:ff9b::808:808", "2002:808:808::1"],
)
def test_global_unicast_addresses_may_receive_webhooks(address: str) -> None:
    assert not internal(ipaddress.ip_address(address))
