"""``GET /metrics`` served from the node's own asyncio event loop, with limits a slow or hostile
client cannot get around.

Why not prometheus_client's own server: it is wsgiref's ``ThreadingWSGIServer``, which starts a
thread per connection and has neither a connection cap nor timeouts, so a thousand connections
that send half a request line exhaust the node's file descriptors (and threads). Here every
connection is a coroutine on the loop the node already runs (accepted one at a time, and capped
before the next is accepted), the HTTP
framing is parsed by `h11 <https://h11.readthedocs.io>`_ (a small, well-kept, I/O-free HTTP/1.1
parser that enforces a size cap on the request head), and prometheus_client does what it is good
at: rendering the exposition (:func:`~prometheus_client.exposition.choose_encoder`, text or
OpenMetrics as the scraper asks) and deciding on gzip
(:func:`~prometheus_client.exposition.gzip_accepted`).

The limits (module constants, each a constructor parameter too; docs/security.md, "The metrics
server"):

* :data:`MAX_CONNECTIONS` connections at once. When one more arrives, the connection that has
  waited longest for its request head is closed to make room (a scraper sends its request at
  once and is answered in milliseconds, so slow connections cannot keep it out); when every
  connection is already being answered, the new one is closed as soon as it is accepted. Either
  way the flood costs neither a thread nor a lasting file descriptor.
* :data:`HEAD_TIMEOUT_S` for the whole request head (request line and headers, and the TLS
  handshake when served over HTTPS): a client that sends it byte by byte (slowloris) is
  disconnected then, however steadily it trickles.
* :data:`MAX_HEAD_BYTES` of request head; a larger one is answered ``431`` and the connection
  closed, having buffered at most that plus one read.
* :data:`SEND_TIMEOUT_S` to take the response: a client that stops reading is disconnected.
* ``GET`` and ``HEAD`` only (``405`` otherwise), one request per connection
  (``Connection: close``), a request body is never read.
* The exposition is rendered at most once per :data:`RENDER_INTERVAL_S` (a render of a node's
  registry takes a few milliseconds; scrapes that arrive together share one), so requests in a
  loop cannot take the event loop away from the rounds.

With a ``token`` every request must carry ``Authorization: Bearer <token>`` (compared in constant
time); one without it is answered ``401``, counted (:attr:`MetricsServer.refused`) and logged
(rate-limited by the node's log guard). With an ``ssl`` context the server speaks HTTPS.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import hmac
import http
import logging
import socket
import ssl as ssl_module
import struct
import time
from collections.abc import Callable

import h11
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder, gzip_accepted

__all__ = [
    "HEAD_TIMEOUT_S",
    "MAX_CONNECTIONS",
    "MAX_HEAD_BYTES",
    "METRICS_PATH",
    "RENDER_INTERVAL_S",
    "SEND_TIMEOUT_S",
    "MetricsServer",
]

log = logging.getLogger(__name__)

#: What :class:`MetricsServer` answers on: Prometheus's default scrape path.
METRICS_PATH = "/metrics"
#: Connections served at once; one more is closed on accept (a scraper needs one or two).
MAX_CONNECTIONS = 32
#: Seconds a client has to send its whole request head (and finish the TLS handshake).
HEAD_TIMEOUT_S = 5.0
#: Seconds a client has to take the whole response.
SEND_TIMEOUT_S = 10.0
#: Bytes of request line and headers at most; beyond them the answer is 431.
MAX_HEAD_BYTES = 16 * 1024
#: Seconds a rendered exposition is reused for the scrapes that follow it.
RENDER_INTERVAL_S = 0.5
#: Connections the kernel queues until the loop accepts them (they hold no descriptor of the
#: node's until then).
LISTEN_BACKLOG = 64
#: Bytes read from a connection at a time.
_READ_BYTES = 4096

_TEXT = "text/plain; charset=utf-8"


def _abort(sock: socket.socket) -> None:
    """Close ``sock`` at once, with a reset rather than a lingering close."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


class _Conn:
    """One accepted connection: its socket, then its stream, and the task serving it."""

    __slots__ = ("sock", "task", "writer")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.writer: asyncio.StreamWriter | None = None
        self.task: asyncio.Task[None] | None = None


class _Reply:
    """A response to write: status, headers, body (the body is left out for ``HEAD``)."""

    def __init__(self, status: int, body: bytes, headers: list[tuple[str, str]] | None = None,
                 content_type: str = _TEXT) -> None:
        self.status = status
        self.body = body
        self.headers = [("Content-Type", content_type), *(headers or [])]


class MetricsServer:
    """``GET /metrics`` over HTTP(S) on ``host:port``, served from the running event loop.

    ``refresh`` runs on the loop before a render, so that the exposition shows the node as it is
    now; a refresh that raises is logged and the last status served. Other paths answer 404.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        host: str,
        port: int,
        refresh: Callable[[], object] | None = None,
        *,
        token: str | None = None,
        ssl: ssl_module.SSLContext | None = None,
        max_connections: int = MAX_CONNECTIONS,
        head_timeout: float = HEAD_TIMEOUT_S,
        send_timeout: float = SEND_TIMEOUT_S,
        max_head_bytes: int = MAX_HEAD_BYTES,
        render_interval: float = RENDER_INTERVAL_S,
    ) -> None:
        if max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, got {max_connections}")
        self.registry = registry
        self.host, self.port = host, port
        self.refresh = refresh
        self._token = None if token is None else token.encode()
        self.ssl = ssl
        self.max_connections = max_connections
        self.head_timeout = head_timeout
        self.send_timeout = send_timeout
        self.max_head_bytes = max_head_bytes
        self.render_interval = render_interval
        #: requests refused for a missing or wrong bearer token
        self.refused = 0
        #: connections closed on accept because :attr:`max_connections` were being answered
        self.rejected = 0
        #: connections still waiting for their request head closed to make room for a new one
        self.evicted = 0
        #: connections closed because the head or the response took too long
        self.timed_out = 0
        self._listener: socket.socket | None = None
        self._acceptor: asyncio.Task[None] | None = None
        #: every connection served, and (a subset, oldest first) those still reading their head;
        #: dicts as ordered sets
        self._conns: dict[_Conn, None] = {}
        self._reading: dict[_Conn, None] = {}
        self._cache: dict[tuple[str, bool], tuple[float, _Reply]] = {}

    def __repr__(self) -> str:  # the token stays out of logs
        return f"MetricsServer({self.host!r}, {self.port}, token={'set' if self._token else None})"

    @property
    def scheme(self) -> str:
        return "https" if self.ssl is not None else "http"

    async def start(self) -> int:
        """Listen on the running loop; return the bound port (``port`` 0 picks one). Raises
        :class:`OSError` when the address cannot be bound."""
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        listener = socket.create_server((self.host, self.port), family=family,
                                        backlog=LISTEN_BACKLOG)
        listener.setblocking(False)
        self._listener = listener
        self.port = int(listener.getsockname()[1])
        self._acceptor = asyncio.create_task(self._accept_loop(listener),
                                             name=f"metrics-{self.port}")
        return self.port

    async def stop(self) -> None:
        """Stop listening and drop the connections in progress."""
        acceptor, self._acceptor = self._acceptor, None
        if acceptor is None:
            return
        acceptor.cancel()
        await asyncio.gather(acceptor, return_exceptions=True)
        if self._listener is not None:
            self._listener.close()
        conns = list(self._conns)
        for conn in conns:
            self._drop(conn)  # each connection's task sees its stream end, and ends
        tasks = [c.task for c in conns if c.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=2.0)

    # ------------------------------------------------------------------------------- connections
    @property
    def active(self) -> int:
        """Connections open now."""
        return len(self._conns)

    async def _accept_loop(self, listener: socket.socket) -> None:
        """Accept one connection at a time and decide on it before the next: at the cap the
        oldest connection still reading its head is closed (or, when none is, the new one), so
        the node never holds more than :attr:`max_connections` + 1 descriptors for it."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, _ = await loop.sock_accept(listener)
            except OSError as exc:  # out of descriptors (the node's other servers, say)
                log.warning("metrics: cannot accept a connection: %s", exc,
                            extra={"event": "metrics_accept_failed"})
                await asyncio.sleep(0.1)
                continue
            if len(self._conns) >= self.max_connections:
                oldest = next(iter(self._reading), None)
                if oldest is None:
                    self.rejected += 1
                    _abort(sock)  # the fd is released now: no lingering close
                    continue
                self.evicted += 1
                self._drop(oldest)  # its reader sees the end of the stream and the task ends
            conn = _Conn(sock)
            self._conns[conn] = None
            self._reading[conn] = None
            conn.task = asyncio.create_task(self._handle(conn))
            await asyncio.sleep(0)  # an accept that did not wait still lets the others run

    async def _handle(self, conn: _Conn) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.head_timeout  # for the handshake and the head together
        try:
            reader = asyncio.StreamReader(limit=_READ_BYTES)
            protocol = asyncio.StreamReaderProtocol(reader)
            try:
                async with asyncio.timeout_at(deadline):
                    transport, _ = await loop.connect_accepted_socket(
                        lambda: protocol, conn.sock, ssl=self.ssl,
                        ssl_handshake_timeout=self.head_timeout if self.ssl else None)
            except TimeoutError:
                self.timed_out += 1
                return
            writer = asyncio.StreamWriter(transport, protocol, reader, loop)
            conn.writer = writer
            if conn not in self._conns:  # dropped while the stream was being set up
                return
            await self._serve(reader, writer, conn, deadline)
        except (ConnectionError, ssl_module.SSLError, OSError):
            pass  # the client went away or spoke garbage: nothing to answer
        finally:
            self._drop(conn)

    def _drop(self, conn: _Conn) -> None:
        """Forget a connection and close its socket at once."""
        self._reading.pop(conn, None)
        if self._conns.pop(conn, "gone") == "gone":
            return
        if conn.writer is not None:
            conn.writer.transport.abort()
        elif conn.task is not None and conn.task is not asyncio.current_task():
            conn.task.cancel()  # still setting up (TLS handshake): the cancel closes it
        else:
            _abort(conn.sock)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     conn: _Conn, deadline: float) -> None:
        h11conn = h11.Connection(h11.SERVER, max_incomplete_event_size=self.max_head_bytes)
        try:
            async with asyncio.timeout_at(deadline):
                request = await self._read_head(h11conn, reader)
        except TimeoutError:
            self.timed_out += 1
            return
        except h11.RemoteProtocolError as exc:
            self._reading.pop(conn, None)
            status = exc.error_status_hint
            reply = _Reply(status, b"request header fields too large\n" if status == 431
                           else b"bad request\n")
            await self._send(h11conn, writer, reply, head_only=False)
            return
        finally:
            self._reading.pop(conn, None)
        if request is None:
            return  # closed before a whole request
        head_only = request.method == b"HEAD"
        await self._send(h11conn, writer, self._answer(request), head_only=head_only)

    @staticmethod
    async def _read_head(conn: h11.Connection,
                         reader: asyncio.StreamReader) -> h11.Request | None:
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await reader.read(_READ_BYTES))
                continue
            if isinstance(event, h11.Request):
                return event
            return None  # ConnectionClosed: the client left

    def _answer(self, request: h11.Request) -> _Reply:
        headers = {name: value for name, value in request.headers}
        if self._token is not None and not self._authorized(headers.get(b"authorization", b"")):
            self.refused += 1
            log.warning("metrics: refused a request without the bearer token of "
                        "node.metrics_token", extra={"event": "metrics_token_refused"})
            return _Reply(401, b"unauthorized: send Authorization: Bearer <node.metrics_token>\n",
                          [("WWW-Authenticate", 'Bearer realm="dacflnode metrics"')])
        if request.method not in (b"GET", b"HEAD"):
            return _Reply(405, b"method not allowed: use GET\n", [("Allow", "GET, HEAD")])
        path = request.target.split(b"?", 1)[0]
        if path != METRICS_PATH.encode():
            return _Reply(404, f"not found: the metrics are at {METRICS_PATH}\n".encode())
        return self._exposition(headers.get(b"accept", b"").decode("latin-1"),
                                headers.get(b"accept-encoding", b"").decode("latin-1"))

    def _authorized(self, authorization: bytes) -> bool:
        """Whether ``Authorization`` is ``Bearer <the token>`` (the scheme in any case, the
        token compared in constant time)."""
        assert self._token is not None
        scheme, _, credentials = authorization.strip().partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(credentials.strip(),
                                                                   self._token)

    def _exposition(self, accept: str, accept_encoding: str) -> _Reply:
        """The exposition in the format the scraper accepts, rendered at most once per
        :attr:`render_interval` for each format."""
        encoder, content_type = choose_encoder(accept)
        compress = gzip_accepted(accept_encoding)
        now = time.monotonic()
        cached = self._cache.get((content_type, compress))
        if cached is not None and now - cached[0] < self.render_interval:
            return cached[1]
        if self.refresh is not None:
            try:
                self.refresh()
            except Exception:  # a failed refresh serves the last status, and says why
                log.warning("metrics: could not refresh the status", exc_info=True,
                            extra={"event": "status_failed"})
        body = encoder(self.registry)
        extra = []
        if compress:
            body = gzip.compress(body, compresslevel=1)
            extra.append(("Content-Encoding", "gzip"))
        reply = _Reply(200, body, extra, content_type)
        self._cache = {k: v for k, v in self._cache.items() if now - v[0] < self.render_interval}
        self._cache[(content_type, compress)] = (now, reply)
        return reply

    async def _send(self, conn: h11.Connection, writer: asyncio.StreamWriter, reply: _Reply,
                    head_only: bool) -> None:
        headers = [*reply.headers, ("Content-Length", str(len(reply.body))),
                   ("Connection", "close")]
        try:
            data = conn.send(h11.Response(status_code=reply.status, headers=headers,
                                          reason=http.HTTPStatus(reply.status).phrase)) or b""
            if not head_only:
                data += conn.send(h11.Data(data=reply.body)) or b""
            data += conn.send(h11.EndOfMessage()) or b""
        except h11.LocalProtocolError:  # h11 cannot answer in this state: just close
            return
        try:
            async with asyncio.timeout(self.send_timeout):
                writer.write(data)
                await writer.drain()
        except TimeoutError:
            self.timed_out += 1
