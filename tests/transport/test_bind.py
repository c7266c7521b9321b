"""A server address that cannot be bound is one :class:`BindError` naming the address and the
kernel's reason, raised before gRPC tries it (gRPC would only say "Failed to bind" and print
its own error line); an address free on this host binds as before."""

from __future__ import annotations

import socket

import pytest

from dacflnode.transport import channels


async def test_a_taken_port_is_refused_with_the_kernels_reason():
    server = channels.create_server()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        with pytest.raises(channels.BindError) as refused:
            channels.bind(server, address)
    assert refused.value.address == address
    assert str(refused.value) == f"cannot listen on {address}: Address already in use"
    await server.stop(None)


async def test_a_wildcard_address_is_refused_when_a_local_one_holds_the_port():
    server = channels.create_server()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(channels.BindError, match="Address already in use"):
            channels.bind(server, f"0.0.0.0:{taken.getsockname()[1]}")
    await server.stop(None)


async def test_an_address_not_of_this_host_is_refused_and_a_free_one_binds():
    server = channels.create_server()
    with pytest.raises(channels.BindError, match=r"192\.0\.2\.1:7000: Cannot assign"):
        channels.bind(server, "192.0.2.1:7000")  # TEST-NET-1: never a local address
    port = channels.bind(server, "127.0.0.1:0")
    assert port > 0
    await server.stop(None)
