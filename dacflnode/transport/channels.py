"""Every gRPC server and channel of a node is made here, with one set of options.

Only this module and ``grpc_*.py`` import grpc. The options, and why:

``grpc.max_send_message_length`` / ``grpc.max_receive_message_length`` (8 MiB)
    A round's state travels as ~1 MiB :class:`StateChunk` messages (see
    :mod:`dacflnode.wire`), so no single gRPC message is ever large; the limit is set
    explicitly (the default receive limit is 4 MiB) with headroom for the header and for a
    sender using larger chunks, while still bounding what one message can make a node allocate.

``grpc.keepalive_time_ms`` (20 s) / ``grpc.keepalive_timeout_ms`` (10 s) /
``grpc.keepalive_permit_without_calls`` (1) / ``grpc.http2.max_pings_without_data`` (0)
    Neighbours are idle between exchanges while they train (minutes for a big model). HTTP/2
    pings every 20 s, also with no call in flight, keep NATs and firewalls from dropping the
    connection and detect a dead neighbour within ~30 s instead of at the next push.
    ``permit_without_calls`` matters on the server too: without it the server counts a ping on an
    idle connection as abuse and closes the connection with ``GOAWAY too_many_pings``.

``grpc.http2.min_ping_interval_without_data_ms`` (10 s, server) /
``grpc.http2.max_ping_strikes`` (2, server)
    The server accepts the clients' 20 s pings (the default minimum is 5 minutes) but still
    closes connections that ping much faster than that. This is the name gRPC core reads for
    the *received* ping interval (``GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS``);
    under any other name the server keeps its 5 minutes, counts a strike per keepalive ping of
    an idle connection and, at the third, closes it with ``GOAWAY ENHANCE_YOUR_CALM
    "too_many_pings"`` (an error line on the client's stderr, and a reconnect).
    ``tests/transport/test_keepalive.py`` keeps a client and a server idle over several pings.

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

Resource limits of every server (each measured against this grpcio: the option is honoured as
described; ``tests/e2e/test_attacks.py`` and ``benchmarks/attacks.py`` rerun the attacks):

``grpc.max_allowed_incoming_connections`` (:func:`connection_cap`: 256, fewer under a low
``RLIMIT_NOFILE``, server)
    gRPC core's connection quota, per server: a connection beyond it is closed right after
    ``accept`` (300 connects to a server capped at 100: 100 open, 200 closed at once). Each
    connection is a file descriptor and an HTTP/2 session, so the cap is what a flood of
    connections runs into, never the descriptor limit: a process out of descriptors cannot
    write its checkpoint or log, and Python code that opens a file raises. The daemon raises its
    soft ``RLIMIT_NOFILE`` to the hard limit at start; the cap is then ``(limit - 128) // 2``
    (128 descriptors for the process's own files, threads and channels; halved because a node
    runs two servers, each with its own quota), at least 16 and at most 256 — a neighbour needs
    one connection, so 256 leaves room for large neighbourhoods and reconnects. The cap keeps
    the process alive; it does not keep a flood from crowding out neighbours while it lasts
    (there is no per-address quota in gRPC): that is a firewall's job.

``grpc.server_handshake_timeout_ms`` (10 s, server)
    A connection must finish its HTTP/2 (and TLS) handshake within 10 s. Without it (default
    120 s) a raw TCP connect that sends nothing holds a slot of the quota for two minutes, and
    one that the client closed before the handshake kept its slot too: a server capped at 20
    stayed ``UNAVAILABLE`` for 6 s after 30 such sockets were closed, and recovered within a
    second with this option (idle raw sockets were cut after the timeout).

``grpc.max_connection_idle_ms`` (5 min, server)
    A connection with no call in flight for 5 minutes gets ``GOAWAY``, which frees its slot
    (measured: idle HTTP/2 connections closed after the set time). A neighbour's channel simply
    reconnects on its next call; keepalive pings do not count as activity.

``grpc.max_concurrent_streams`` (16, server)
    Calls in flight on one connection; further calls wait on the client, except that a client
    opening many at once on a fresh connection, before it has read the server's settings, has
    some refused with ``UNAVAILABLE`` (measured: 2 of 30, and 29 of 301 with 50 at a time). A
    neighbour has at most a Hello, a push and a pull in flight, so only a flood meets either.

``maximum_concurrent_rpcs`` (:data:`MAX_CONCURRENT_RPCS` = 64, ``grpc.aio.server`` argument)
    Calls in flight on the whole server, over all connections; a call beyond it fails at once
    with ``RESOURCE_EXHAUSTED`` (measured: 10 served, 20 refused of 30). This is what bounds
    memory: a push holds at most one state (its decoder's buffer), so stalled pushes cost at
    most 64 states, and the Receiver's per-stream deadlines free them. A node with more than
    ~20 neighbours needs a larger value. Who may hold how many of these slots (per certificate
    identity, per host, per claimed id and host) is :mod:`~dacflnode.transport.slots`' job.

Not set: ``grpc.max_connection_age_ms`` (honoured too: connections closed after the set age
plus ``grpc.max_connection_age_grace_ms``) would cut a long push of a large model at the end of
its grace period, while the per-stream deadlines already bound a busy connection's calls. The
clients' ``grpc.http2.max_pings_without_data`` is set above; ping floods are refused by the
server's ``max_ping_strikes``.

Every call made on these channels carries its own deadline (see ``grpc_transport``).

Mutual TLS (``node.tls``): a node's certificate carries its node id as a DNS
subject-alternative name, so a channel to a neighbour sets ``grpc.ssl_target_name_override`` to
that neighbour's id, whatever host name or address it is reached at: the handshake then fails
unless the server proves it is that node. The server side requires a client certificate from
the same CA; the servicer reads the client's id from the verified certificate.
"""

from __future__ import annotations

import contextlib
import errno
import socket
from collections.abc import Sequence

import grpc

from dacflnode.security.tls import TlsMaterial

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
    ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
    ("grpc.http2.max_ping_strikes", 2),
    ("grpc.server_handshake_timeout_ms", 10_000),
    ("grpc.max_connection_idle_ms", 300_000),
    ("grpc.max_concurrent_streams", 16),
]

#: Calls in flight on one server, over all its connections (see the module docstring).
MAX_CONCURRENT_RPCS = 64
#: Most connections one server accepts, and the descriptors kept for everything else.
MAX_CONNECTIONS = 256
FD_RESERVE = 128


def connection_cap() -> int:
    """Connections one server accepts, from the process's current ``RLIMIT_NOFILE``."""
    import resource

    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS
    return max(16, min(MAX_CONNECTIONS, (soft - FD_RESERVE) // 2))


def server_options() -> list[tuple[str, int]]:
    """:data:`SERVER_OPTIONS` plus the connection cap for the current descriptor limit."""
    return [*SERVER_OPTIONS, ("grpc.max_allowed_incoming_connections", connection_cap())]

CHANNEL_OPTIONS: list[tuple[str, int]] = [
    *_COMMON_OPTIONS,
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.min_reconnect_backoff_ms", 250),
    ("grpc.max_reconnect_backoff_ms", 5_000),
]


class BindError(OSError):
    """The server could not listen on ``address`` (taken, not local, or malformed)."""

    def __init__(self, message: str, address: str) -> None:
        super().__init__(message)
        self.address = address


def _check_free(address: str) -> None:
    """Raise :class:`BindError` with the kernel's reason when ``address`` cannot be bound.

    gRPC reports a taken port only as "Failed to bind" (and logs its own error line on stderr);
    binding a plain socket first, as gRPC does (``SO_REUSEADDR``), gives the reason in one line
    and keeps gRPC's line off stderr. Every address the host resolves to must be free: a port
    taken on one of them would split the node's connections with another process.
    """
    host, sep, port_text = address.rpartition(":")
    if not sep or not port_text.isdigit() or int(port_text) == 0:
        return  # malformed, or port 0 (any free port): gRPC decides
    host = host.strip("[]")
    try:
        infos = socket.getaddrinfo(host or None, int(port_text), type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        raise BindError(f"cannot listen on {address}: cannot resolve {host!r} ({exc})",
                        address) from exc
    failures: list[OSError] = []
    for family, socktype, proto, _, sockaddr in infos:
        with socket.socket(family, socktype, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                with contextlib.suppress(OSError):
                    probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            try:
                probe.bind(sockaddr)
            except OSError as exc:
                failures.append(exc)
    # an address of the host that does not exist here (``::1`` without IPv6) is gRPC's to skip
    taken = [e for e in failures if e.errno in (errno.EADDRINUSE, errno.EACCES)]
    if taken or (failures and len(failures) == len(infos)):
        first = (taken or failures)[0]
        raise BindError(f"cannot listen on {address}: {first.strerror or first}",
                        address) from first


def create_server(
    interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
) -> grpc.aio.Server:
    """A new, not yet started asyncio gRPC server (call from a running event loop);
    ``interceptors`` run before every call (the Control service checks its token there)."""
    return grpc.aio.server(options=server_options(), interceptors=list(interceptors) or None,
                           maximum_concurrent_rpcs=MAX_CONCURRENT_RPCS)


def create_channel(
    address: str,
    tls: TlsMaterial | None = None,
    target_name: str | None = None,
    *,
    ca: bytes | None = None,
) -> grpc.aio.Channel:
    """An asyncio channel to ``address`` (``host:port``); connects lazily.

    With ``tls``, the channel presents this node's certificate and verifies the server's
    against ``tls.ca``; with only ``ca`` (a Control client, which authenticates by token), it
    verifies the server but presents no certificate. Either way the server's certificate must
    carry ``target_name`` (a node id) as a subject-alternative name; without one, gRPC checks
    the host of ``address`` instead. With neither, the channel is plaintext.
    """
    if tls is None and ca is None:
        return grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
    if tls is not None:
        credentials = grpc.ssl_channel_credentials(tls.ca, tls.key, tls.cert)
    else:
        credentials = grpc.ssl_channel_credentials(ca)
    options: list[tuple[str, int | str]] = [*CHANNEL_OPTIONS]
    if target_name is not None:
        options.append(("grpc.ssl_target_name_override", target_name))
    return grpc.aio.secure_channel(address, credentials, options=options)


def server_credentials(tls: TlsMaterial, *, require_client_auth: bool = True
                       ) -> grpc.ServerCredentials:
    """This node's certificate as server credentials.

    ``require_client_auth`` (the Neighbor service): the handshake fails unless the client
    presents a certificate signed by ``tls.ca``, so every call has an authenticated identity.
    Without it (an exposed Control service) any client may connect and the token decides.
    """
    return grpc.ssl_server_credentials(
        [(tls.key, tls.cert)],
        root_certificates=tls.ca if require_client_auth else None,
        require_client_auth=require_client_auth,
    )


def bind(
    server: grpc.aio.Server,
    address: str,
    tls: TlsMaterial | None = None,
    *,
    require_client_auth: bool = True,
) -> int:
    """Listen on ``address`` (``host:port``; port 0 picks a free one) and return the bound port.

    With ``tls`` the port speaks TLS only (a plaintext client fails the handshake), requiring
    a client certificate from ``tls.ca`` unless ``require_client_auth`` is false (see
    :func:`server_credentials`). Raises :class:`BindError` (an :class:`OSError`) naming the
    address when it cannot be bound.
    """
    _check_free(address)
    try:
        if tls is None:
            port = int(server.add_insecure_port(address))
        else:
            port = int(server.add_secure_port(
                address, server_credentials(tls, require_client_auth=require_client_auth)))
    except RuntimeError as exc:  # grpc >= 1.47 raises; older versions returned 0
        raise BindError(f"cannot listen on {address}: {exc} (port taken, or not a local "
                        "host:port?)", address) from exc
    if port == 0:
        raise BindError(f"cannot listen on {address} (port taken, or not a local host:port?)",
                        address)
    return port
