"""Every gRPC server and channel of a node is made here, with one set of options.

Only this module and ``grpc_*.py`` import grpc. The options, and why:

``grpc.max_send_message_length`` / ``grpc.max_receive_message_length`` (8 MiB)
    A round's state travels as ~1 MiB :class:`StateChunk` messages (see
    :mod:`dacflnode.wire.codec`), so no single gRPC message is ever large; the limit is set
    explicitly (the default receive limit is 4 MiB) with headroom for the header and for a
    sender using larger chunks, while still bounding what one message can make a node allocate.

``grpc.keepalive_time_ms`` (20 s) / ``grpc.keepalive_timeout_ms`` (10 s) /
``grpc.keepalive_permit_without_calls`` (1) / ``grpc.http2.max_pings_without_data`` (0)
    Neighbours are idle between exchanges while they train (minutes for a big model). HTTP/2
    pings every 20 s, also with no call in flight, keep NATs and firewalls from dropping the
    connection and detect a dead neighbour within ~30 s instead of at the next push.
    ``permit_without_calls`` matters on the server too: without it the server counts a ping on an
    idle connection as abuse and closes the connection with ``GOAWAY too_many_pings``.

``grpc.http2.min_recv_ping_interval_without_data_ms`` (10 s, server) /
``grpc.http2.max_ping_strikes`` (2, server)
    The server accepts the clients' 20 s pings (the default minimum is 5 minutes) but still
    closes connections that ping much faster than that.

``grpc.so_reuseport`` (0, server)
    gRPC turns ``SO_REUSEPORT`` on by default, so two processes can both "successfully" listen
    on one port and the kernel splits connections between them. A node must fail loudly when
    its port is taken, and tests that listen on ``127.0.0.1:0`` must never share a port.

``grpc.http2.bdp_probe`` (1) / ``grpc.http2.lookahead_bytes`` (4 MiB)
    Bulk transfer: the HTTP/2 stream window starts at 64 KiB, and a sender may have at most a
    window of data in flight per round trip. A 4 MiB initial window lets several 1 MiB chunks be
    in flight from the first round trip of a connection; bandwidth-delay-product probing (on by
    default, set explicitly here) then retunes the window to the measured link. On loopback it
    makes no measurable difference (a 64 MiB push runs at ~300 MiB/s either way, CPU-bound on
    two cores); it is meant for links with real round-trip times, where throughput is bounded by
    window / RTT until probing catches up. It bounds what a stream can buffer on the receiver.

``grpc.initial_reconnect_backoff_ms`` / ``grpc.min_reconnect_backoff_ms`` (250 ms) /
``grpc.max_reconnect_backoff_ms`` (5 s, channels)
    Neighbours start in any order, minutes apart. With the default backoff (1 s growing to
    120 s) a channel to a neighbour that came up late could stay in ``TRANSIENT_FAILURE`` for two
    minutes; calls fail fast (:class:`~dacflnode.transport.base.PeerUnavailable`) while it does,
    and the caller retries, so a short maximum backoff is what makes a late neighbour usable
    within seconds.

Every call made on these channels carries its own deadline (see ``grpc_transport``).
"""

from __future__ import annotations

import grpc

MAX_MESSAGE_BYTES = 8 * 1024 * 1024

_COMMON_OPTIONS: list[tuple[str, int]] = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.http2.bdp_probe", 1),
    ("grpc.http2.lookahead_bytes", 4 * 1024 * 1024),
]

SERVER_OPTIONS: list[tuple[str, int]] = [
    *_COMMON_OPTIONS,
    ("grpc.so_reuseport", 0),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
    ("grpc.http2.max_ping_strikes", 2),
]

CHANNEL_OPTIONS: list[tuple[str, int]] = [
    *_COMMON_OPTIONS,
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.min_reconnect_backoff_ms", 250),
    ("grpc.max_reconnect_backoff_ms", 5_000),
]


class BindError(OSError):
    """The server could not listen on the address (taken, not local, or malformed)."""


def create_server() -> grpc.aio.Server:
    """A new, not yet started asyncio gRPC server (call from a running event loop)."""
    return grpc.aio.server(options=SERVER_OPTIONS)


def create_channel(address: str) -> grpc.aio.Channel:
    """An insecure asyncio channel to ``address`` (``host:port``); connects lazily."""
    return grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)


def bind(server: grpc.aio.Server, address: str) -> int:
    """Listen on ``address`` (``host:port``; port 0 picks a free one) and return the bound port.

    Raises :class:`BindError` (an :class:`OSError`) naming the address when it cannot be bound.
    """
    try:
        port = int(server.add_insecure_port(address))
    except RuntimeError as exc:  # grpc >= 1.47 raises; older versions returned 0
        raise BindError(f"cannot listen on {address}: {exc} (port taken, or not a local "
                        "host:port?)") from exc
    if port == 0:
        raise BindError(f"cannot listen on {address} (port taken, or not a local host:port?)")
    return port
