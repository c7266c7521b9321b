"""The serving side of ``dacfl.v1.Neighbor`` over gRPC: :class:`NeighborServicer` hands every
call to the node's :class:`~dacflnode.transport.receiver.Receiver` (the same code the in-memory
transport runs) and turns its :class:`~dacflnode.wire.errors.WireError` into the gRPC status it
names, with the refusal's reason in the trailing metadata ``dacfl-reason``;
:func:`add_neighbor_service` registers it with hand-made (de)serializers. With TLS the servicer
passes the node ids the client's certificate names (:func:`authenticated_ids`) to the Receiver.
The calling side is :mod:`dacflnode.transport.grpc_transport`."""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, NoReturn

import grpc

from dacflnode._proto.dacfl.v1 import neighbor_pb2 as pb
from dacflnode.transport.exchanging import ExchangeDesk
from dacflnode.transport.receiver import (
    Receiver,
)
from dacflnode.transport.slots import Call, CallSlots, PoolKey, peer_host
from dacflnode.wire.encoder import encode
from dacflnode.wire.errors import REASON_METADATA_KEY, Reason, WireError
from dacflnode.wire.fast_path import Chunk, chunk_size, parse_chunk, serialize_chunk
from dacflnode.wire.message import CHUNK_BYTES

#: The full name of the Neighbor service, as the health service reports it.
SERVICE_NAME: str = pb.DESCRIPTOR.services_by_name["Neighbor"].full_name

#: How long, and how many bytes beyond a full state, a refused push is read on (see
#: :meth:`NeighborServicer._drain`).
DRAIN_SECONDS = 10.0
DRAIN_SLACK_BYTES = 4 * CHUNK_BYTES

#: The auth-context key under which gRPC lists the client certificate's subject-alternative
#: names (a node's certificate carries its id as a DNS name).
SAN_KEY = "x509_subject_alternative_name"

async def _abort(context: grpc.aio.ServicerContext[Any, Any], err: WireError) -> NoReturn:
    """End the call with ``err``'s status, its reason in the trailing metadata."""
    code = getattr(grpc.StatusCode, err.code, grpc.StatusCode.UNKNOWN)
    await context.abort(code, err.message,
                        trailing_metadata=((REASON_METADATA_KEY, err.reason.value),))
    raise AssertionError("context.abort() returned")  # pragma: no cover - abort always raises


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
        self.desk = ExchangeDesk(receiver)
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

    async def _claimed_stream(self, what: str, call: Call, requests: AsyncIterator[Chunk],
                              context: grpc.aio.ServicerContext[Any, Any]
                              ) -> AsyncIterator[Chunk]:
        """A chunk stream's first message read within its deadline, the call moved to the pool
        of the sender its header claims, and the whole stream, that first message included."""
        first = await self._first(what, call, requests, context)
        if isinstance(first, pb.StateChunk) and first.HasField("header"):
            await self._claim(what, call, first.header.sender, int(first.header.round),
                              context)
        else:
            await self._claim(what, call, "", -1, context)

        async def stream() -> AsyncIterator[Chunk]:
            if first is not None:
                yield first
            async for chunk in requests:
                yield chunk

        return stream()

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

    async def Agree(
        self, request_iterator: AsyncIterator[pb.AgreeRequest],
        context: grpc.aio.ServicerContext[pb.AgreeRequest, pb.AgreeReply],
    ) -> pb.AgreeReply:
        """The feature agreement (:meth:`Receiver.agree`), served as Hello is."""
        call, peer_ids = await self._open("agree", context)
        try:
            request = await self._first("agree", call, request_iterator, context)
            if request is None:
                request = pb.AgreeRequest()
            await self._claim("agree", call, request.sender, -1, context)
            try:
                return self.receiver.agree(request, context.peer(), peer_ids=peer_ids)
            except WireError as err:
                await _abort(context, err)
        finally:
            self.slots.close(call)

    async def PushState(
        self, request_iterator: AsyncIterator[Chunk],
        context: grpc.aio.ServicerContext[Chunk, pb.PushReply],
    ) -> pb.PushReply:
        call, peer_ids = await self._open("push", context)
        try:
            stream = await self._claimed_stream("push", call, request_iterator, context)
            try:
                return await self.receiver.push(stream, context.peer(), peer_ids=peer_ids,
                                                call=call)
            except WireError as err:
                await self._refuse_stream(err, call, request_iterator, context)
        except asyncio.CancelledError:  # cut while its refusal was being drained
            cut = call.taken()
            if cut is None:
                raise
            await _abort(context, cut)
        finally:
            self.slots.close(call)

    async def _refuse_stream(self, err: WireError, call: Call, stream: AsyncIterator[Chunk],
                             context: grpc.aio.ServicerContext[Any, Any]) -> NoReturn:
        """End a refused request stream with ``err``: read the rest of it first (see
        :meth:`_drain`), unless it stalled or was cut for another (then at once)."""
        if err.reason not in _CUT_NOW and err is not call.cut_error:
            await self._drain(stream)
        await _abort(context, err)

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


    async def Exchange(
        self, request_iterator: AsyncIterator[Chunk],
        context: grpc.aio.ServicerContext[Chunk, bytes],
    ) -> AsyncIterator[bytes]:
        """One asynchronous exchange (:mod:`dacflnode.transport.exchanging`): the request
        stream as a push's, the answer streamed back."""
        call, peer_ids = await self._open("exchange", context)
        try:
            stream = await self._claimed_stream("exchange", call, request_iterator, context)
            try:
                reply = await self.desk.serve(stream, context.peer(), peer_ids=peer_ids,
                                              call=call)
            except WireError as err:
                await self._refuse_stream(err, call, request_iterator, context)
            for chunk in encode(reply):
                yield serialize_chunk(chunk)
                call.touch()
        except asyncio.CancelledError:
            cut = call.taken()
            if cut is None:
                raise
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
        "Agree": grpc.stream_unary_rpc_method_handler(
            servicer.Agree,
            request_deserializer=pb.AgreeRequest.FromString,
            response_serializer=pb.AgreeReply.SerializeToString,
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
        "Exchange": grpc.stream_stream_rpc_method_handler(
            servicer.Exchange,
            request_deserializer=parse_chunk,
            response_serializer=serialize_chunk,
        ),
    }
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)
