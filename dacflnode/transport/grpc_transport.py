"""The gRPC :class:`~dacflnode.transport.base.Transport`: the ``dacfl.v1.Neighbor`` service.

Serving side: :class:`NeighborServicer` hands every call to the node's
:class:`~dacflnode.transport.receiver.Receiver` (the same code the in-memory transport runs) and
turns its :class:`~dacflnode.wire.errors.WireError` into the gRPC status it names, with the
refusal's :class:`~dacflnode.wire.errors.Reason` in the trailing metadata ``dacfl-reason``. The
server also answers the standard ``grpc.health.v1.Health`` service: ``SERVING`` once started,
``NOT_SERVING`` from the moment :meth:`GrpcTransport.stop` begins.

Identities: with ``tls`` the server accepts only clients whose certificate the run's CA signed,
and the servicer passes the node ids that certificate names (:func:`authenticated_ids`) to the
Receiver, which refuses a Hello, push or pull made in any other node's name. A client that
fails the TLS handshake (plaintext, another CA) never reaches the servicer: it sees
``UNAVAILABLE``, as if nothing listened.

Calling side: one channel per neighbour (made by :mod:`dacflnode.transport.channels`, on first
contact), and every call carries a deadline. Status codes map to the transport's errors:

* ``UNAVAILABLE``, ``DEADLINE_EXCEEDED``, ``CANCELLED``, ``RESOURCE_EXHAUSTED`` or
  ``INTERNAL`` without a refusal reason, and ``RESOURCE_EXHAUSTED`` with
  :attr:`~dacflnode.wire.errors.Reason.TOO_MANY_CALLS` (see :func:`unreachable`):
  :class:`PeerUnavailable` (down, not started yet, busy or too slow: retry later);
* Hello: ``FAILED_PRECONDITION``, ``PERMISSION_DENIED``, ``UNIMPLEMENTED``:
  :class:`HandshakeRefused`; any other code: :class:`PeerUnavailable`;
* PushState / PullState: any other code: ``WireError(code name, details, reason)``.

The reason is read back from ``dacfl-reason``; a missing or unknown one reads as
:attr:`~dacflnode.wire.errors.Reason.OTHER`, so callers branch on the reason, never on text.

Lifetimes: once :meth:`GrpcTransport.stop` has begun, new calls raise :class:`TransportClosed`
and no channel is (re)opened; calls in flight that stop cuts off raise it too. A caller that is
cancelled while it pushes or pulls cancels its gRPC call and gets its ``CancelledError``; the
push stream is written from the caller's own task, so nothing outlives the call.

A refused push is read to its end before the status is sent (see
:meth:`NeighborServicer._drain`), so the sender gets the real status, not ``INTERNAL``.

Nothing here blocks the event loop: preparing an outgoing message (copy to host memory if it is
on a GPU; once per message, however many neighbours receive it) and the final checks run in
worker threads; chunks are 1 MiB copies.

The state streams skip protobuf's copies of the payload, not its format: PushState and
PullState are registered with hand-made (de)serializers (:func:`add_neighbor_service`,
:class:`NeighborCalls`). A pushed data chunk is serialized with one copy of its slice of the
tensors and hashed from that copy, in a worker thread while the chunk before it is sent
(:meth:`~dacflnode.transport.outgoing.ChunkStream.prefetched`); the checksum follows the data in
the stream's trailer. A received data chunk is parsed as a view of the received bytes
(:func:`~dacflnode.wire.fast_path.parse_chunk`), whose payload is then copied, hashed and summed
straight into the receive buffer in a worker thread while the next chunk is received
(:class:`~dacflnode.transport.receiver.Assembler`). The bytes on the wire are exactly
protobuf's, so a peer using the generated stubs reads and writes the same streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any, NoReturn

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from dacflnode._proto.dacfl.v1 import neighbor_pb2 as pb
from dacflnode._proto.dacfl.v1 import neighbor_pb2_grpc
from dacflnode.security.tls import TlsMaterial
from dacflnode.transport import channels
from dacflnode.transport.base import (
    HandshakeRefused,
    Identity,
    Inbox,
    PeerUnavailable,
    Transport,
    TransportClosed,
    cancelled_by_caller,
)
from dacflnode.transport.handshake import (
    HANDSHAKE_REFUSALS,
    PeerIdentity,
    check_identity,
    hello_request,
)
from dacflnode.transport.outgoing import ChunkStream, HeaderCache
from dacflnode.transport.receiver import (
    FIRST_MESSAGE_TIMEOUT,
    IDLE_TIMEOUT,
    STREAM_TIMEOUT,
    Assembler,
    Receiver,
)
from dacflnode.transport.slots import Call, CallSlots, PoolKey, peer_host
from dacflnode.wire.decoder import Decoder
from dacflnode.wire.errors import REASON_METADATA_KEY, Reason, WireError
from dacflnode.wire.fast_path import Chunk, chunk_size, parse_chunk, serialize_chunk
from dacflnode.wire.message import CHUNK_BYTES, RoundMessage
from dacflnode.wire.validation import CompressedSpec, Expectation

#: Deadline of one Hello call, in seconds (the setting ``hello_timeout`` is how long a node
#: waits for its neighbours at start, over many such calls).
HELLO_CALL_TIMEOUT = 5.0
#: The full name of the Neighbor service, as the health service reports it.
SERVICE_NAME: str = pb.DESCRIPTOR.services_by_name["Neighbor"].full_name

#: How long, and how many bytes beyond a full state, a refused push is read on (see
#: :meth:`NeighborServicer._drain`).
DRAIN_SECONDS = 10.0
DRAIN_SLACK_BYTES = 4 * CHUNK_BYTES

#: The auth-context key under which gRPC lists the client certificate's subject-alternative
#: names (a node's certificate carries its id as a DNS name).
SAN_KEY = "x509_subject_alternative_name"

_UNREACHABLE = frozenset({
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.CANCELLED,
})
#: Codes that mean "try again later" when no refusal reason comes with them (see unreachable).
_UNREACHABLE_WITHOUT_REASON = frozenset({
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.INTERNAL,
})


async def _abort(context: grpc.aio.ServicerContext[Any, Any], err: WireError) -> NoReturn:
    """End the call with ``err``'s status, its reason in the trailing metadata."""
    code = getattr(grpc.StatusCode, err.code, grpc.StatusCode.UNKNOWN)
    await context.abort(code, err.message,
                        trailing_metadata=((REASON_METADATA_KEY, err.reason.value),))
    raise AssertionError("context.abort() returned")  # pragma: no cover - abort always raises


def unreachable(err: grpc.aio.AioRpcError) -> bool:
    """Whether ``err`` means "try again later" rather than "the peer refused this".

    Besides the transport's own failures, a ``RESOURCE_EXHAUSTED`` without a refusal reason is
    gRPC's server-wide call limit (``maximum_concurrent_rpcs``, see
    :mod:`~dacflnode.transport.channels`): the peer is busy, perhaps flooded, and a neighbour's
    push must be retried, not given up. The receiver's own ``RESOURCE_EXHAUSTED`` refusals
    (a stream cut at its idle or total deadline) carry a reason, except that
    :attr:`~Reason.TOO_MANY_CALLS` means busy too: this node's quota of call slots on the peer
    is taken (:mod:`~dacflnode.transport.slots`). An ``INTERNAL`` without a
    reason is grpc's own "Internal error from Core": a write failed because the call had ended
    under it (its deadline passed while this process was stopped, the connection broke); the
    peer refused nothing.
    """
    if err.code() in _UNREACHABLE:
        return True
    if (err.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            and reason_of(err) is Reason.TOO_MANY_CALLS):
        return True
    return err.code() in _UNREACHABLE_WITHOUT_REASON and reason_of(err) is Reason.OTHER


def reason_of(err: grpc.aio.AioRpcError) -> Reason:
    """The refusal reason a peer sent with ``err`` (:attr:`Reason.OTHER` if none or unknown)."""
    metadata = err.trailing_metadata()
    return Reason.parse(metadata.get(REASON_METADATA_KEY) if metadata else None)


def wire_error(err: grpc.aio.AioRpcError) -> WireError:
    """The :class:`WireError` the peer raised, rebuilt from its status and trailing metadata."""
    return WireError(err.code().name, err.details() or "", reason_of(err))


def authenticated_ids(context: grpc.aio.ServicerContext[Any, Any]) -> frozenset[str]:
    """The DNS subject-alternative names of the client certificate that the TLS handshake
    verified (empty when the client presented none: it is then no one)."""
    names = context.auth_context().get(SAN_KEY, ())
    return frozenset(name.decode("utf-8", "replace") for name in names)


class NeighborServicer:
    """``dacfl.v1.Neighbor`` over a :class:`Receiver` (which validates and logs); served by
    :func:`add_neighbor_service`.

    ``authenticated`` (a server that requires client certificates): every call passes the
    identities of the verified client certificate to the receiver as ``peer_ids``, and the
    receiver refuses a Hello, push or pull made in another node's name. Without it,
    ``peer_ids`` is None: the ids in the messages are taken on trust.

    Call slots (:mod:`~dacflnode.transport.slots`): every call holds a slot of ``slots`` from
    its start, in its certificate identity's pool (TLS) or, on plaintext, in its host's pool
    until its first message names who it claims to be, then in the pool of that id and host.
    Every call must send its first message (a push stream's header, the Hello or pull request)
    within ``first_message_timeout`` seconds (``RESOURCE_EXHAUSTED``,
    :attr:`~dacflnode.wire.errors.Reason.IDLE`); Hello and PullState are therefore served as
    request streams of which the first message is read, with that deadline (on the wire a
    unary request is a stream of one message, so any client can call them).
    """

    def __init__(self, receiver: Receiver, *, authenticated: bool = False,
                 on_hello: Callable[[str], None] | None = None,
                 first_message_timeout: float | None = None,
                 slots: CallSlots | None = None) -> None:
        self.receiver = receiver
        self.authenticated = authenticated
        #: called with the neighbour's id after each Hello this node answered
        self.on_hello = on_hello
        self.first_message_timeout = (receiver.first_message_timeout
                                      if first_message_timeout is None else first_message_timeout)
        self.slots = slots if slots is not None else CallSlots(
            stale_after=self.first_message_timeout)
        self._payload_bytes = 4 * sum(math.prod(shape) for shape in receiver.tensors.values())
        if receiver.compressed is not None:  # the larger of the two sets a push may carry
            self._payload_bytes = max(self._payload_bytes, sum(
                dtype.itemsize * math.prod(shape) for dtype, shape in receiver.compressed.values()))

    def _peer_ids(self, context: grpc.aio.ServicerContext[Any, Any]) -> frozenset[str] | None:
        return authenticated_ids(context) if self.authenticated else None

    async def _open(self, what: str, context: grpc.aio.ServicerContext[Any, Any]
                    ) -> tuple[Call, frozenset[str] | None]:
        """Open the call's slot (aborting the call when its pool is full)."""
        call = Call()
        peer_ids = self._peer_ids(context)
        if peer_ids is not None:
            key: PoolKey = ("cert", ",".join(sorted(peer_ids)))
        else:
            key = ("address", peer_host(context.peer()))
        try:
            self.slots.open(call, key)
        except WireError as err:
            self.receiver.refused(what, "?", context.peer(), -1, err)
            await _abort(context, err)
        return call, peer_ids

    async def _first(self, what: str, call: Call, requests: AsyncIterator[Any],
                     context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        """The call's first message (``None`` when it ended without one), read within the
        first-message deadline; aborts the call when the deadline passes or it is cut."""
        try:
            try:
                async with asyncio.timeout(self.first_message_timeout):
                    first = await anext(aiter(requests), None)
            except TimeoutError:
                raise WireError("RESOURCE_EXHAUSTED", "the call sent no first message within "
                                f"{self.first_message_timeout:.3g}s", Reason.IDLE) from None
            except asyncio.CancelledError:
                call.raise_if_cut()
                raise
        except WireError as err:
            self.slots.close(call)
            self.receiver.refused(what, "?", context.peer(), -1, err)
            await _abort(context, err)
        call.touch()
        return first

    async def _claim(self, what: str, call: Call, claimed: str, round_: int,
                     context: grpc.aio.ServicerContext[Any, Any]) -> None:
        """On plaintext, move the call to the pool of the id its first message claims."""
        if self.authenticated:
            return
        try:
            self.slots.move(call, ("claim", claimed, peer_host(context.peer())))
        except WireError as err:
            self.receiver.refused(what, claimed, context.peer(), round_, err)
            await _abort(context, err)

    async def Hello(
        self, request_iterator: AsyncIterator[pb.HelloRequest],
        context: grpc.aio.ServicerContext[pb.HelloRequest, pb.HelloReply],
    ) -> pb.HelloReply:
        call, peer_ids = await self._open("hello", context)
        try:
            request = await self._first("hello", call, request_iterator, context)
            if request is None:
                request = pb.HelloRequest()
            await self._claim("hello", call, request.node_id, -1, context)
            try:
                reply = self.receiver.hello(request, context.peer(), peer_ids=peer_ids)
            except WireError as err:
                await _abort(context, err)
            if self.on_hello is not None:
                self.on_hello(request.node_id)
            return reply
        finally:
            self.slots.close(call)

    async def PushState(
        self, request_iterator: AsyncIterator[Chunk],
        context: grpc.aio.ServicerContext[Chunk, pb.PushReply],
    ) -> pb.PushReply:
        call, peer_ids = await self._open("push", context)
        try:
            first = await self._first("push", call, request_iterator, context)
            if isinstance(first, pb.StateChunk) and first.HasField("header"):
                await self._claim("push", call, first.header.sender, int(first.header.round),
                                  context)
            else:
                await self._claim("push", call, "", -1, context)

            async def stream() -> AsyncIterator[Chunk]:
                if first is not None:
                    yield first
                async for chunk in request_iterator:
                    yield chunk

            try:
                return await self.receiver.push(stream(), context.peer(), peer_ids=peer_ids,
                                                call=call)
            except WireError as err:
                if err.reason not in _CUT_NOW and err is not call.cut_error:
                    await self._drain(request_iterator)  # (a stream cut for another: at once)
                await _abort(context, err)
        except asyncio.CancelledError:  # cut while its refusal was being drained
            cut = call.taken()
            if cut is None:
                raise
            await _abort(context, cut)
        finally:
            self.slots.close(call)

    async def _drain(self, stream: AsyncIterator[Chunk]) -> None:
        """Read and drop the rest of a refused stream, so the sender half-closes before the
        status is sent.

        Ending a client stream while the client is still writing races in grpc's asyncio client
        (grpc/grpc#36066): a write that fails because the call has ended replaces the status
        the server sent with ``INTERNAL: Internal error from Core``, so the sender would not
        learn why it was refused (e.g. that this node is already in a later round). Draining
        costs the bandwidth of one state and is bounded by the expected payload size plus
        :data:`DRAIN_SLACK_BYTES` and by :data:`DRAIN_SECONDS`; a sender beyond either bound is
        cut off at once.
        """
        limit = self._payload_bytes + DRAIN_SLACK_BYTES
        seen = 0
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(DRAIN_SECONDS):
                async for chunk in stream:
                    seen += chunk_size(chunk)
                    if seen > limit:
                        return

    async def PullState(
        self, request_iterator: AsyncIterator[pb.PullRequest],
        context: grpc.aio.ServicerContext[pb.PullRequest, bytes],
    ) -> AsyncIterator[bytes]:
        call, peer_ids = await self._open("pull", context)
        try:
            request = await self._first("pull", call, request_iterator, context)
            if request is None:
                request = pb.PullRequest()
            await self._claim("pull", call, request.requester, int(request.round), context)
            stream: Iterator[bytes]
            try:
                stream = self.receiver.pull_serialized(request, context.peer(),
                                                       peer_ids=peer_ids)
            except WireError as err:
                await _abort(context, err)
            try:
                for chunk in stream:
                    yield chunk
                    call.touch()
            except asyncio.CancelledError:
                cut = call.taken()
                if cut is None:
                    raise
                self.receiver.refused("pull", request.requester, context.peer(),
                                      int(request.round), cut)
                await _abort(context, cut)
        finally:
            self.slots.close(call)


#: Refusals after which a push stream is ended at once instead of read to its end: it stalled,
#: or it holds a slot or buffer another stream needs.
_CUT_NOW = frozenset({Reason.IDLE, Reason.TOO_SLOW, Reason.PREEMPTED, Reason.TOO_MANY_CALLS})


def add_neighbor_service(servicer: NeighborServicer, server: grpc.aio.Server) -> None:
    """Serve ``dacfl.v1.Neighbor`` on ``server`` with hand-made handlers: PushState's chunks
    are parsed by :func:`~dacflnode.wire.fast_path.parse_chunk` (a data chunk's payload stays a
    view of the received bytes), PullState sends the bytes :meth:`Receiver.pull_serialized`
    made, and Hello and PullState read their request as a stream (of one message: see
    :class:`NeighborServicer`), so that a call that never sends it is cut at the first-message
    deadline instead of holding its slot until the caller's own deadline."""
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
        "Hello": grpc.stream_unary_rpc_method_handler(
            servicer.Hello,
            request_deserializer=pb.HelloRequest.FromString,
            response_serializer=pb.HelloReply.SerializeToString,
        ),
        "PushState": grpc.stream_unary_rpc_method_handler(
            servicer.PushState,
            request_deserializer=parse_chunk,
            response_serializer=pb.PushReply.SerializeToString,
        ),
        "PullState": grpc.stream_stream_rpc_method_handler(
            servicer.PullState,
            request_deserializer=pb.PullRequest.FromString,
            response_serializer=serialize_chunk,
        ),
    }
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)


class NeighborCalls:
    """The ``dacfl.v1.Neighbor`` calls on one channel: ``hello`` as generated; ``push`` takes
    serialized chunks (bytes, as :meth:`ChunkStream.serialized` makes them) and ``pull``
    yields chunks as :func:`~dacflnode.wire.fast_path.parse_chunk` returns them."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.hello = neighbor_pb2_grpc.NeighborStub(channel).Hello
        self.push: grpc.aio.StreamUnaryMultiCallable[bytes, pb.PushReply] = channel.stream_unary(
            f"/{SERVICE_NAME}/PushState",
            request_serializer=serialize_chunk,
            response_deserializer=pb.PushReply.FromString,
        )
        self.pull: grpc.aio.UnaryStreamMultiCallable[pb.PullRequest, Chunk] = (
            channel.unary_stream(
                f"/{SERVICE_NAME}/PullState",
                request_serializer=pb.PullRequest.SerializeToString,
                response_deserializer=parse_chunk,
            ))


class GrpcTransport(Transport):
    """This node's side of the Neighbor protocol over gRPC.

    ``peers`` maps each neighbour's id to its ``host:port``; it is copied to :attr:`peers` and an
    address is read when that neighbour is first contacted, so it may be filled in after
    :meth:`start` (tests that listen on port 0 do). ``server``, if given, must not be started
    yet and must not already serve ``grpc.health.v1.Health``: the transport adds its services,
    binds ``listen``, starts it, and stops it in :meth:`stop`. A stopped transport cannot be
    started again (make a new one).

    ``tls``: serve on a TLS-only port that requires a client certificate from ``tls.ca``, and
    connect to each neighbour with this node's certificate, requiring the neighbour's to carry
    the neighbour's id (see :mod:`~dacflnode.transport.channels`).

    ``health_listen``: also serve ``grpc.health.v1`` alone, in plaintext, on that address (the
    same health status as the peer port). A probe that cannot present a client certificate,
    such as Kubernetes' native gRPC probe, checks the node there; nothing else is served on it.

    ``compressed``: a compressed run's tensor set (part name -> dtype, shape); pushes and
    state pulls then carry it or the float32 set ``tensors`` (docs/compression.md).

    ``hello_call_timeout``: the deadline of one Hello call, in seconds; how long a node keeps
    calling a neighbour that does not answer is the runner's (the setting ``hello_timeout``).
    """

    def __init__(
        self,
        identity: Identity,
        listen: str,
        peers: Mapping[str, str],
        inbox: Inbox,
        tensors: Mapping[str, tuple[int, ...]],
        *,
        compressed: CompressedSpec | None = None,
        server: grpc.aio.Server | None = None,
        hello_call_timeout: float = HELLO_CALL_TIMEOUT,
        tls: TlsMaterial | None = None,
        idle_timeout: float = IDLE_TIMEOUT,
        stream_timeout: float = STREAM_TIMEOUT,
        first_message_timeout: float = FIRST_MESSAGE_TIMEOUT,
        health_listen: str | None = None,
    ) -> None:
        super().__init__(identity, peers, inbox, tensors, compressed)
        self.tls = tls
        self.health_listen = health_listen
        self.health_port: int | None = None
        self._health_server: grpc.aio.Server | None = None
        self.listen = listen
        self.peers: dict[str, str] = dict(peers)
        self.receiver = Receiver(identity, inbox, self.tensors, self.stats,
                                 compressed=self.compressed, idle_timeout=idle_timeout,
                                 stream_timeout=stream_timeout,
                                 first_message_timeout=first_message_timeout)
        #: The Neighbor calls in flight, by caller (see :mod:`~dacflnode.transport.slots`).
        self.slots = CallSlots(stale_after=first_message_timeout)
        self.hello_call_timeout = hello_call_timeout
        self.port: int | None = None
        self._server = server
        self._health: Any = None
        self._state = "new"  # new -> serving -> stopped
        self._stubs: dict[str, NeighborCalls] = {}
        self._channels: dict[str, grpc.aio.Channel] = {}
        #: channels being closed (replaced by :meth:`_fresh_channel`)
        self._closing: set[asyncio.Task[None]] = set()
        self._outgoing = HeaderCache(self.receiver)

    # ------------------------------------------------------------------ serving
    async def start(self) -> None:
        if self._state != "new":
            raise RuntimeError(f"transport of {self.identity.node_id} is {self._state}")
        server = self._server if self._server is not None else channels.create_server()
        add_neighbor_service(
            NeighborServicer(self.receiver, authenticated=self.tls is not None,
                             on_hello=self._fresh_channel, slots=self.slots), server)
        self._health = health.aio.HealthServicer()
        for service in ("", SERVICE_NAME):
            await self._health.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        try:
            self.port = channels.bind(server, self.listen, self.tls)
        except OSError:
            self._state = "stopped"
            await server.stop(None)  # a server dropped unstopped warns once its loop is closed
            raise
        await server.start()
        self._server = server
        if self.health_listen is not None:
            probe = channels.create_server()
            health_pb2_grpc.add_HealthServicer_to_server(self._health, probe)
            try:
                self.health_port = channels.bind(probe, self.health_listen)
            except OSError:
                await probe.stop(None)
                await server.stop(None)
                self._state = "stopped"
                raise
            await probe.start()
            self._health_server = probe
        self._state = "serving"
        for service in ("", SERVICE_NAME):
            await self._health.set(service, health_pb2.HealthCheckResponse.SERVING)

    async def stop(self, grace: float = 1.0) -> None:
        """Refuse new calls, report ``NOT_SERVING``, let calls in flight finish for up to
        ``grace`` seconds, stop serving, then close every channel to the neighbours."""
        serving = self._state == "serving"
        self._state = "stopped"
        if serving:
            await self._health.enter_graceful_shutdown()
            assert self._server is not None
            await self._server.stop(grace)
            if self._health_server is not None:
                await self._health_server.stop(None)
        channels_, self._channels, self._stubs = self._channels, {}, {}
        for channel in channels_.values():
            await channel.close()
        await self._outgoing.close()
        self.receiver.close()
        for stats in self.stats.values():
            stats.connected = False

    # ------------------------------------------------------------------ calling
    def _closed(self) -> TransportClosed:
        return TransportClosed(f"the transport of {self.identity.node_id} is stopped")

    def _stub(self, peer: str) -> NeighborCalls:
        if self._state == "stopped":
            raise self._closed()  # never reopen a channel after stop
        stub = self._stubs.get(peer)
        if stub is None:
            address = self.peers.get(peer)
            if address is None:
                raise ValueError(f"{peer!r} is not a neighbour of {self.identity.node_id}")
            channel = channels.create_channel(
                address, self.tls, target_name=peer if self.tls is not None else None)
            self._channels[peer] = channel
            stub = self._stubs[peer] = NeighborCalls(channel)
        return stub

    def _fresh_channel(self, peer: str) -> None:
        """``peer`` just said Hello: it is up. A channel to it that is waiting out its reconnect
        backoff (the neighbour was down: a restart) is replaced, so that the next call reaches
        it now rather than seconds later (docs/faults.md, section 5)."""
        channel = self._channels.get(peer)
        if channel is None or self._state == "stopped":
            return
        if channel.get_state() is not grpc.ChannelConnectivity.TRANSIENT_FAILURE:
            return
        del self._channels[peer]
        self._stubs.pop(peer, None)
        task = asyncio.get_running_loop().create_task(channel.close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def channel_ready(self, peer: str) -> bool | None:
        """Whether the channel to ``peer`` is connected now, as grpc knows it without trying to
        connect (a neighbour that stopped closed its end: the channel is no longer ready);
        ``None`` before the node first called it, and while it connects."""
        channel = self._channels.get(peer)
        if channel is None or self._state == "stopped":
            return None
        state = channel.get_state()
        if state is grpc.ChannelConnectivity.CONNECTING:
            return None
        return state is grpc.ChannelConnectivity.READY

    def _unavailable(self, peer: str, what: str, err: grpc.aio.AioRpcError) -> PeerUnavailable:
        self._stats(peer).connected = False
        return PeerUnavailable(
            f"{what} {peer} at {self.peers[peer]}: {err.code().name}: {err.details()}"
        )

    def _interrupted(self, peer: str, what: str) -> Exception:
        """What a call that grpc cancelled, although its caller was not cancelled, raises:
        :class:`TransportClosed` when :meth:`stop` closed its channel."""
        self._stats(peer).connected = False
        if self._state == "stopped":
            return self._closed()
        return PeerUnavailable(f"{what} {peer} at {self.peers.get(peer)}: cancelled")

    async def hello(self, peer: str, join_round: int = 0) -> PeerIdentity:
        stub = self._stub(peer)
        started = time.perf_counter()
        call = stub.hello(hello_request(self.identity, join_round),
                          timeout=self.hello_call_timeout)
        try:
            reply = await call
        except asyncio.CancelledError:
            call.cancel()
            if cancelled_by_caller():
                raise
            raise self._interrupted(peer, "handshake with") from None
        except grpc.aio.AioRpcError as err:
            code = err.code()
            if code.name in HANDSHAKE_REFUSALS:
                raise HandshakeRefused(err.details() or code.name, reason_of(err)) from err
            if code == grpc.StatusCode.UNIMPLEMENTED:
                raise HandshakeRefused(
                    f"{peer} at {self.peers[peer]} does not serve {SERVICE_NAME}"
                ) from err
            raise self._unavailable(peer, "handshake with", err) from err
        other = check_identity(self.identity, peer, reply)
        self._stats(peer).answered(started)
        return other

    async def push(self, peer: str, message: RoundMessage, timeout: float) -> None:
        stub = self._stub(peer)
        started = time.perf_counter()
        what = f"push of round {message.round} to"
        sent = self.inbox.sent_to(peer, message)
        if sent is not message:  # neighbours pull the published state, not this one
            self.receiver.publish(message, None)
        out = await self._outgoing.get(sent, publish=sent is message)
        if self._state == "stopped":
            raise self._closed()
        stats = self._stats(peer)
        stream = ChunkStream(out)
        remaining = max(0.0, timeout - (time.perf_counter() - started))
        call = stub.push(timeout=remaining)
        try:
            with self._failures(peer, what, call):
                try:
                    async with contextlib.aclosing(stream.prefetched()) as chunks:
                        async for chunk in chunks:
                            await call.write(chunk)
                    await call.done_writing()
                except (asyncio.InvalidStateError, grpc.aio.InternalError):
                    # the call ended before the whole stream (the peer ended it, or its
                    # deadline passed while this process was stopped: grpc then fails the
                    # half-close with ExecuteBatchError): its status says why
                    pass
                await call
        finally:
            stats.sent(stream.sent, message.round)
        stats.answered(started)
        stats.messages_sent += 1

    @contextlib.contextmanager
    def _failures(self, peer: str, what: str, call: grpc.aio.Call) -> Iterator[None]:
        """Raise what a failed ``call`` to ``peer`` means: the caller's own cancellation as it
        is, any other cancellation as :meth:`_interrupted` says, an unreachable peer as
        :class:`PeerUnavailable`, any other status as the :class:`WireError` it carries."""
        try:
            yield
        except asyncio.CancelledError:
            call.cancel()
            if cancelled_by_caller():
                raise
            raise self._interrupted(peer, what) from None
        except grpc.aio.AioRpcError as err:
            if unreachable(err):
                raise self._unavailable(peer, what, err) from err
            raise wire_error(err) from err

    async def _pull(self, peer: str, request: pb.PullRequest, expect: Expectation,
                    timeout: float) -> RoundMessage:
        stub = self._stub(peer)
        decoder = Decoder(expect, pool=self.receiver.pool)
        what = (f"pull of copy {request.copy_id} from" if request.copy_id
                else f"pull of round {request.round} from")
        assembler = Assembler(decoder, self.receiver.worker)
        call = stub.pull(request, timeout=timeout)
        try:
            with self._failures(peer, what, call):
                async for chunk in call:
                    await assembler.take(chunk)
                message = await assembler.finish()
        except WireError:
            assembler.release()
            call.cancel()  # the peer sent something this node does not accept: stop reading
            raise
        except BaseException:
            assembler.release()
            raise
        self._stats(peer).received(decoder.received, int(request.round))
        return message
