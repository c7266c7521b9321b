"""The ``/metrics`` server's limits, in process: a connection cap that slow clients cannot use to
keep a scraper out, the deadline for the request head, the header-size cap, GET/HEAD only, the
bearer token, HTTPS, and no thread per connection. Deadlines are shortened through the
constructor; every wait polls with a deadline."""

from __future__ import annotations

import asyncio
import gzip
import resource
import socket
import ssl
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from dacflnode.daemon.metrics_http import MetricsServer
from dacflnode.daemon.prometheus import NodeMetrics, NodeStatus
from dacflnode.security.certs import tls_files, write_certs
from tests.harness.polling import until

TOKEN = "s3cret-metrics-token-0123456789"
GET = b"GET /metrics HTTP/1.1\r\nHost: node\r\n\r\n"


def request(port: int, data: bytes, timeout: float = 10.0,
            wrap: Callable[[socket.socket], socket.socket] | None = None) -> bytes:
    """Send ``data`` and read until the server closes (blocking: run it in a thread)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as raw:
        sock = wrap(raw) if wrap is not None else raw
        sock.sendall(data)
        out = b""
        try:
            while chunk := sock.recv(65536):
                out += chunk
        except ConnectionResetError:
            pass
        return out


def status_of(reply: bytes) -> int:
    return int(reply.split(b" ", 2)[1]) if reply.startswith(b"HTTP/1.1 ") else 0


async def fetch(port: int, data: bytes = GET, **kw: object) -> bytes:
    return await asyncio.to_thread(request, port, data, **kw)  # type: ignore[arg-type]


def slow(port: int, count: int, partial: bytes = b"GET /metr") -> list[socket.socket]:
    """``count`` connections that each sent half a request line and then nothing."""
    socks = []
    for _ in range(count):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(partial)
        socks.append(s)
    return socks


def closed_by_server(s: socket.socket) -> bool:
    s.setblocking(False)
    try:
        return s.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


@pytest.fixture
async def metrics() -> NodeMetrics:
    m = NodeMetrics("n0", process=False)
    m.update(NodeStatus("n0", "dacfl", 3, 10, "training"))
    return m


@pytest.fixture
async def serve(metrics: NodeMetrics) -> AsyncIterator[Callable[..., asyncio.Future[int]]]:
    servers: list[MetricsServer] = []

    async def start(**kw: object) -> MetricsServer:
        server = MetricsServer(metrics.registry, "127.0.0.1", 0, **kw)  # type: ignore[arg-type]
        await server.start()
        servers.append(server)
        return server

    yield start  # type: ignore[misc]
    for server in servers:
        await server.stop()


async def test_a_scrape_gets_the_exposition_and_head_gets_only_the_headers(serve):
    server = await serve()
    reply = await fetch(server.port)
    assert status_of(reply) == 200 and b'dacfl_round{node="n0"} 3.0' in reply
    assert b"Connection: close" in reply
    head = await fetch(server.port, b"HEAD /metrics HTTP/1.1\r\nHost: n\r\n\r\n")
    assert status_of(head) == 200 and head.endswith(b"\r\n\r\n")


async def test_gzip_and_openmetrics_are_served_when_asked_for(serve):
    server = await serve()
    reply = await fetch(server.port, b"GET /metrics HTTP/1.1\r\nHost: n\r\nAccept-Encoding: gzip"
                        b"\r\nAccept: application/openmetrics-text; version=1.0.0\r\n\r\n")
    head, _, body = reply.partition(b"\r\n\r\n")
    assert b"Content-Encoding: gzip" in head and b"application/openmetrics-text" in head
    assert gzip.decompress(body).rstrip().endswith(b"# EOF")


async def test_only_get_and_head_on_metrics_are_answered(serve):
    server = await serve()
    post = await fetch(server.port, b"POST /metrics HTTP/1.1\r\nHost: n\r\n"
                       b"Content-Length: 1000000\r\n\r\nxx")
    assert status_of(post) == 405 and b"Allow: GET, HEAD" in post
    assert status_of(await fetch(server.port, b"GET / HTTP/1.1\r\nHost: n\r\n\r\n")) == 404
    assert status_of(await fetch(server.port, b"\x16\x03\x01garbage\r\n\r\n")) == 400


async def test_a_request_head_not_finished_in_time_is_closed(serve):
    server = await serve(head_timeout=0.5)
    socks = await asyncio.to_thread(slow, server.port, 5)
    trickle = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    start = time.monotonic()
    try:
        # one byte every 0.1 s: steady, yet the whole head is never there by the deadline
        for byte in b"GET /metrics HTTP/1.1\r\nX-Slow: aaaa":
            if closed_by_server(trickle):
                break
            trickle.setblocking(True)
            trickle.send(bytes([byte]))
            await asyncio.sleep(0.1)
        assert await until(lambda: server.active == 0, timeout=5.0)
        assert time.monotonic() - start < 4.0
        assert all(closed_by_server(s) for s in socks) and closed_by_server(trickle)
        assert server.timed_out == 6
    finally:
        for s in (*socks, trickle):
            s.close()


@pytest.mark.slow
async def test_slow_connections_beyond_the_cap_cost_no_thread_and_cannot_keep_a_scrape_out(
        serve):
    server = await serve(max_connections=8, head_timeout=60.0)
    await asyncio.to_thread(int)  # the test's own worker thread, started before counting
    threads = threading.active_count()
    socks = await asyncio.to_thread(slow, server.port, 200)
    try:
        assert await until(lambda: server.active + server.evicted >= 200)
        assert server.active <= 8 and server.evicted >= 192
        assert threading.active_count() <= threads  # (a thread of an earlier test may end)
        # the oldest slow ones were closed to make room; the newest still hold their slots
        assert await until(lambda: sum(closed_by_server(s) for s in socks[:150]) == 150)
        assert not any(closed_by_server(s) for s in socks[-8:])
        # a scraper still gets in: it sends its request at once and takes a slot from them
        assert status_of(await fetch(server.port)) == 200
    finally:
        for s in socks:
            s.close()
    assert await until(lambda: server.active == 0)


async def test_oversized_headers_get_431_and_memory_stays_bounded(serve):
    server = await serve(head_timeout=30.0)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    header = b"X-Big: " + b"a" * (64 * 1024) + b"\r\n"

    def attack() -> bytes:
        # 99 headers of 64 KiB per request: 6.3 MiB that the server must not buffer
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: n\r\n")
            try:
                for _ in range(99):
                    s.sendall(header)
            except OSError:
                pass  # the server answered and closed: the rest is refused
            out = b""
            try:
                while chunk := s.recv(65536):
                    out += chunk
            except OSError:
                pass
            return out

    replies = await asyncio.gather(*(asyncio.to_thread(attack) for _ in range(40)))
    assert sum(status_of(r) == 431 for r in replies) >= 30, [r[:40] for r in replies]
    assert all(status_of(r) in (431, 0) for r in replies)
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss_before
    assert grown < 64 << 20, f"40 x 6.3 MiB of headers grew the peak RSS by {grown >> 20} MiB"
    assert await until(lambda: server.active == 0)
    assert status_of(await fetch(server.port)) == 200


async def test_with_a_token_a_request_without_it_gets_401_and_is_counted(serve):
    server = await serve(token=TOKEN)
    assert TOKEN not in repr(server)
    bare = await fetch(server.port)
    assert status_of(bare) == 401 and b"WWW-Authenticate: Bearer" in bare
    assert TOKEN.encode() not in bare
    wrong = await fetch(server.port, b"GET /metrics HTTP/1.1\r\nHost: n\r\n"
                        b"Authorization: Bearer " + b"x" * len(TOKEN) + b"\r\n\r\n")
    assert status_of(wrong) == 401
    # the token is checked before the path: nothing is told without it
    assert status_of(await fetch(server.port, b"GET /x HTTP/1.1\r\nHost: n\r\n\r\n")) == 401
    good = await fetch(server.port, b"GET /metrics HTTP/1.1\r\nHost: n\r\n"
                       b"Authorization: Bearer " + TOKEN.encode() + b"\r\n\r\n")
    assert status_of(good) == 200 and b"dacfl_round" in good
    lower = await fetch(server.port, b"GET /metrics HTTP/1.1\r\nHost: n\r\n"
                        b"authorization: bearer " + TOKEN.encode() + b"\r\n\r\n")
    assert status_of(lower) == 200  # the scheme is case-insensitive (RFC 7235)
    basic = await fetch(server.port, b"GET /metrics HTTP/1.1\r\nHost: n\r\n"
                        b"Authorization: Basic " + TOKEN.encode() + b"\r\n\r\n")
    assert status_of(basic) == 401
    assert server.refused == 4


@pytest.mark.slow
async def test_https_with_the_nodes_certificate(serve, tmp_path: Path):
    write_certs(tmp_path, ["node-0"])
    files = tls_files(tmp_path, "node-0")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(files.cert, files.key)
    server = await serve(ssl=context, token=TOKEN, head_timeout=2.0)
    assert server.scheme == "https"
    client = ssl.create_default_context(cafile=str(files.ca))

    def wrap(s: socket.socket) -> socket.socket:
        return client.wrap_socket(s, server_hostname="node-0")

    good = await fetch(server.port, b"GET /metrics HTTP/1.1\r\nHost: n\r\n"
                       b"Authorization: Bearer " + TOKEN.encode() + b"\r\n\r\n", wrap=wrap)
    assert status_of(good) == 200 and b"dacfl_round" in good
    # plaintext on the HTTPS port: no answer, closed within the head deadline
    start = time.monotonic()
    assert status_of(await fetch(server.port)) == 0
    assert time.monotonic() - start < 5.0
    # a TLS handshake that never starts is a slow head like any other
    socks = await asyncio.to_thread(slow, server.port, 3, b"")
    try:
        assert await until(lambda: all(closed_by_server(s) for s in socks), timeout=6.0)
    finally:
        for s in socks:
            s.close()


async def test_the_daemon_serves_https_with_the_nodes_certificate_beyond_loopback_only(
        serve, tmp_path: Path):
    from dacflnode.daemon.service import Daemon
    from dacflnode.peers.file import parse_peers

    write_certs(tmp_path, ["node-0", "node-1"])
    files = tls_files(tmp_path, "node-0")
    pf = parse_peers({
        "node": {"id": "node-0", "listen": "127.0.0.1:7000", "share": 0,
                 "metrics": "0.0.0.0:9100", "metrics_token": TOKEN,
                 "tls": {"ca": str(files.ca), "cert": str(files.cert), "key": str(files.key)}},
        "neighbours": [{"id": "node-1", "address": "127.0.0.1:7001"}],
        "run": {"nodes": 2, "dataset": "synthetic"}}, tmp_path / "node-0.yaml")
    daemon = Daemon(pf)
    assert daemon.metrics_ssl("127.0.0.1") is None  # the Prometheus of the same host: HTTP
    context = daemon.metrics_ssl("0.0.0.0")
    assert context is not None
    # served here on loopback with the context the daemon made for 0.0.0.0
    server = await serve(ssl=context, token=TOKEN)
    client = ssl.create_default_context(cafile=str(files.ca))
    reply = await fetch(server.port, b"GET /metrics HTTP/1.1\r\nHost: n\r\n"
                        b"Authorization: Bearer " + TOKEN.encode() + b"\r\n\r\n",
                        wrap=lambda s: client.wrap_socket(s, server_hostname="node-0"))
    assert status_of(reply) == 200
