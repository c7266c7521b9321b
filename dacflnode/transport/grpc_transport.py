"""The gRPC :class:`~dacflnode.transport.base.Transport`: the ``dacfl.v1.Neighbor`` service.

Serving side (:mod:`dacflnode.transport.grpc_service`; the status mapping is
:mod:`dacflnode.transport.grpc_status`): :class:`NeighborServicer` hands every call to the node's
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
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

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
from dacflnode.transport.exchanging import check_reply, reply_expectation
from dacflnode.transport.grpc_service import (
    SERVICE_NAME,
    NeighborServicer,
    add_neighbor_service,
)
from dacflnode.transport.grpc_status import reason_of, unreachable, wire_error
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
from dacflnode.transport.slots import CallSlots
from dacflnode.wire.agreement import AgreeItem, AgreePhase, read_reply, request_of
from dacflnode.wire.decoder import Decoder
from dacflnode.wire.encoder import encode
from dacflnode.wire.errors import WireError
from dacflnode.wire.fast_path import Chunk, parse_chunk, serialize_chunk
from dacflnode.wire.message import RoundMessage
from dacflnode.wire.validation import CompressedSpec, Expectation

log = logging.getLogger(__name__)

#: How long past a push's deadline the push may still wait before it is given up as
#: unavailable. gRPC ends the call at its deadline, but a write that began waiting for the
#: call's headers to go out is never woken when the call ends before they did (seen when this
#: process was stopped as the call started: ``_StreamRequestMixin._write`` waits on
#: ``_metadata_sent``, which nothing sets then); without this bound the round waited forever.
PUSH_GRACE_S = 1.0

#: Deadline of one Hello call, in seconds (the setting ``hello_timeout`` is how long a node
#: waits for its neighbours at start, over many such calls).
HELLO_CALL_TIMEOUT = 5.0


class NeighborCalls:
    """The ``dacfl.v1.Neighbor`` calls on one channel: ``hello`` as generated; ``push`` takes
    serialized chunks (bytes, as :meth:`ChunkStream.serialized` makes them) and ``pull``
    yields chunks as :func:`~dacflnode.wire.fast_path.parse_chunk` returns them."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.hello = neighbor_pb2_grpc.NeighborStub(channel).Hello
        self.agree = neighbor_pb2_grpc.NeighborStub(channel).Agree
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
        self.exchange: grpc.aio.StreamStreamMultiCallable[bytes, Chunk] = (
            channel.stream_stream(
                f"/{SERVICE_NAME}/Exchange",
                request_serializer=serialize_chunk,
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

    async def _unary(self, call: Any, peer: str, what: str) -> Any:
        """The reply of a unary ``call``; a cancellation ends the call and is re-raised when
        the caller cancelled, else (the transport stopped) told as :meth:`_interrupted`."""
        try:
            return await call
        except asyncio.CancelledError:
            call.cancel()
            if cancelled_by_caller():
                raise
            raise self._interrupted(peer, what) from None

    async def hello(self, peer: str, join_round: int = 0) -> PeerIdentity:
        stub = self._stub(peer)
        started = time.perf_counter()
        call = stub.hello(hello_request(self.identity, join_round),
                          timeout=self.hello_call_timeout)
        try:
            reply = await self._unary(call, peer, "handshake with")
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

    def serve_agreement(
        self, serve: Callable[[str, AgreePhase, frozenset[str]], list[AgreeItem]]
    ) -> None:
        self.receiver.on_agree = serve

    async def agree(self, peer: str, phase: AgreePhase, have: Iterable[str],
                    timeout: float) -> list[AgreeItem]:
        call = self._stub(peer).agree(request_of(self.identity.node_id, phase, have),
                                      timeout=timeout)
        try:
            reply = await self._unary(call, peer, "agreement with")
        except grpc.aio.AioRpcError as err:
            if err.code().name in ("INVALID_ARGUMENT", "PERMISSION_DENIED", "UNAUTHENTICATED",
                                   "FAILED_PRECONDITION"):
                raise WireError(err.code().name, err.details() or "", reason_of(err)) from err
            raise self._unavailable(peer, "agreement with", err) from err
        return read_reply(reply)

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
            # the call's own deadline ends it; this bounds what grpc can leave waiting past it
            async with asyncio.timeout(remaining + PUSH_GRACE_S):
                with self._failures(peer, what, call):
                    try:
                        async with contextlib.aclosing(stream.prefetched()) as chunks:
                            async for chunk in chunks:
                                await call.write(chunk)
                        await call.done_writing()
                    except (asyncio.InvalidStateError, grpc.aio.InternalError):
                        # the call ended before the whole stream (the peer ended it, or its
                        # deadline passed while this process was stopped: grpc then fails
                        # the half-close with ExecuteBatchError): its status says why
                        pass
                    await call
        except TimeoutError:
            self._stats(peer).connected = False
            log.warning("push of round %d to %s: gRPC still waited %gs past the call's "
                        "deadline; given up (it is retried while the round lasts)",
                        message.round, peer, PUSH_GRACE_S,
                        extra={"event": "push_stuck", "node": self.identity.node_id,
                               "round": message.round, "neighbour": peer})
            raise PeerUnavailable(f"{what} {peer} at {self.peers.get(peer)}: still waiting "
                                  f"{PUSH_GRACE_S:g}s past its deadline") from None
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

    async def exchange(self, peer: str, request: RoundMessage, timeout: float) -> RoundMessage:
        stub = self._stub(peer)
        started = time.perf_counter()
        what = f"exchange {request.exchange_id} with"
        decoder = Decoder(reply_expectation(peer, self.tensors, request, self.compressed))
        assembler = Assembler(decoder, self.receiver.worker)
        if self._state == "stopped":
            raise self._closed()
        requests = [serialize_chunk(chunk) for chunk in encode(request)]
        call = stub.exchange(iter(requests), timeout=timeout)
        try:
            # as a push: the call's deadline ends it, this bounds what grpc may leave waiting
            async with asyncio.timeout(timeout + PUSH_GRACE_S):
                with self._failures(peer, what, call):
                    async for chunk in call:
                        await assembler.take(chunk)
                    reply = await assembler.finish()
        except TimeoutError:
            assembler.release()
            self._stats(peer).connected = False
            raise PeerUnavailable(f"{what} {peer} at {self.peers.get(peer)}: still waiting "
                                  f"{PUSH_GRACE_S:g}s past its deadline") from None
        except WireError:
            assembler.release()
            call.cancel()
            raise
        except BaseException:
            assembler.release()
            raise
        check_reply(request, reply)
        stats = self._stats(peer)
        stats.sent(request.payload_bytes, request.round)
        stats.received(decoder.received, request.round)
        stats.answered(started)
        return reply

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
