"""An in-process :class:`~dacflnode.transport.base.Transport`, for tests and simulations.

A :class:`MemoryNetwork` delivers in one of two ways:

``copy=True`` (the default): byte for byte the network path
    Nothing is shared between nodes but encoded chunks: a push encodes the message with the wire
    codec and feeds the chunks through the *peer's*
    :class:`~dacflnode.transport.receiver.Receiver`, exactly as the gRPC servicer does, so
    validation, logging, refusals and inbox handling are the same code as on the network, and
    the receiving node gets its own copy of every tensor. Tests use this.

``copy=False``: no encoding, for simulations
    A push skips encoding, chunking and checksumming: the peer's receiver validates the
    message's fields exactly as it validates a header (sender, round, degree, tensor names,
    dtypes and shapes; same status codes, same :class:`~dacflnode.wire.errors.Reason`) and puts
    the very :class:`~dacflnode.wire.message.RoundMessage` the sender pushed, with the sender's
    tensor objects, into its inbox. Pulls hand over the published message the same way. Every
    receiver therefore treats delivered tensors as read-only (the node runner only reads them
    to mix), and a sender never mutates a message after pushing it. Byte counters count the
    payload size.

Fault injection: :meth:`MemoryNetwork.partition` cuts the link between two nodes (every call
between them raises :class:`~dacflnode.transport.base.PeerUnavailable`) until
:meth:`MemoryNetwork.heal`; a node that is stopped, or was never created, is unavailable too.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Collection, Iterable, Mapping

from dacflnode._proto.dacfl.v1 import neighbor_pb2 as pb
from dacflnode.transport.base import (
    HandshakeRefused,
    Identity,
    Inbox,
    PeerStats,
    PeerUnavailable,
    Transport,
    TransportClosed,
)
from dacflnode.transport.exchanging import ExchangeDesk, check_reply, reply_expectation
from dacflnode.transport.handshake import (
    HANDSHAKE_REFUSALS,
    PeerIdentity,
    check_identity,
    hello_request,
)
from dacflnode.transport.outgoing import ChunkStream, HeaderCache
from dacflnode.transport.receiver import Receiver, check_message
from dacflnode.wire.agreement import AgreeItem, AgreePhase, read_reply, request_of
from dacflnode.wire.decoder import Decoder
from dacflnode.wire.encoder import encode
from dacflnode.wire.errors import WireError
from dacflnode.wire.message import RoundMessage
from dacflnode.wire.validation import CompressedSpec, Expectation


class MemoryNetwork:
    """The nodes of one in-process network, by id, and the links cut between them.

    ``copy`` chooses how messages travel (see the module docstring): ``True`` encodes and
    decodes every message as the network would, ``False`` hands the sender's tensors over.
    """

    def __init__(self, copy: bool = True,
                 link_delay: Callable[[int], float] | None = None) -> None:
        self.copy = copy
        #: seconds a message of so many payload bytes takes over a link, each way (the
        #: simulator's modelled links, slept on its virtual clock); ``None``: no time
        self.link_delay = link_delay
        self.nodes: dict[str, MemoryTransport] = {}
        self._cut: set[frozenset[str]] = set()

    def add(self, transport: MemoryTransport) -> None:
        node_id = transport.identity.node_id
        old = self.nodes.get(node_id)
        if old is not None and old is not transport and old.running:
            raise ValueError(f"node {node_id!r} is already running on this network")
        self.nodes[node_id] = transport

    def partition(self, a: str, b: str) -> None:
        """Cut the link between ``a`` and ``b`` (both directions)."""
        self._cut.add(frozenset((a, b)))

    def heal(self, a: str, b: str) -> None:
        self._cut.discard(frozenset((a, b)))

    def partitioned(self, a: str, b: str) -> bool:
        return frozenset((a, b)) in self._cut

    def reach(self, src: str, dst: str) -> MemoryTransport:
        """The running node ``dst`` as seen from ``src``; raises :class:`PeerUnavailable`."""
        if self.partitioned(src, dst):
            raise PeerUnavailable(f"{src} cannot reach {dst}: the network is partitioned")
        node = self.nodes.get(dst)
        if node is None:
            raise PeerUnavailable(f"{src} cannot reach {dst}: no such node on the network")
        if not node.running:
            raise PeerUnavailable(f"{src} cannot reach {dst}: it is not running")
        return node


class MemoryTransport(Transport):
    """One node on a :class:`MemoryNetwork`.

    Like the gRPC transport, it refuses every call with :class:`TransportClosed` once
    :meth:`stop` has begun; a stopped node comes back as a new transport with the same
    identity, which replaces it on the network.
    """

    def __init__(
        self,
        network: MemoryNetwork,
        identity: Identity,
        peers: Collection[str],
        inbox: Inbox,
        tensors: Mapping[str, tuple[int, ...]],
        compressed: CompressedSpec | None = None,
    ) -> None:
        super().__init__(identity, sorted(peers), inbox, tensors, compressed)
        self.network = network
        self.peers = frozenset(peers)
        self.receiver = Receiver(identity, inbox, self.tensors, self.stats,
                                 compressed=self.compressed)
        #: Who this node is to the peers it calls: the in-memory network knows its callers,
        #: as mutual TLS does on the network.
        self._me = frozenset({identity.node_id})
        self.running = False
        self.closed = False
        self._outgoing = HeaderCache(self.receiver)
        self.desk = ExchangeDesk(self.receiver)
        network.add(self)

    @property
    def address(self) -> str:
        return f"memory:{self.identity.node_id}"

    async def start(self) -> None:
        if self.closed:
            raise RuntimeError(f"transport of {self.identity.node_id} is stopped")
        self.network.add(self)  # a restarted node replaces its stopped predecessor
        self.running = True

    async def stop(self, grace: float = 1.0) -> None:
        self.running = False
        self.closed = True
        await self._outgoing.close()
        for stats in self.stats.values():
            stats.connected = False

    def _reach(self, peer: str) -> MemoryTransport:
        if self.closed:
            raise TransportClosed(f"the transport of {self.identity.node_id} is stopped")
        if peer not in self.peers:
            raise ValueError(f"{peer!r} is not a neighbour of {self.identity.node_id}")
        try:
            return self.network.reach(self.identity.node_id, peer)
        except PeerUnavailable:
            self.stats[peer].connected = False
            raise

    async def hello(self, peer: str, join_round: int = 0) -> PeerIdentity:
        target = self._reach(peer)
        started = time.perf_counter()
        try:
            reply = target.receiver.hello(hello_request(self.identity, join_round), self.address,
                                          peer_ids=self._me)
        except WireError as exc:
            if exc.code in HANDSHAKE_REFUSALS:
                raise HandshakeRefused(exc.message, exc.reason) from exc
            raise PeerUnavailable(f"{peer}: {exc.code}: {exc.message}") from exc
        other = check_identity(self.identity, peer, reply)
        self.stats[peer].answered(started)
        return other

    async def push(self, peer: str, message: RoundMessage, timeout: float) -> None:
        target = self._reach(peer)
        stats = self.stats[peer]
        started = time.perf_counter()
        sent = self.inbox.sent_to(peer, message)
        try:
            async with asyncio.timeout(timeout):
                if self.network.copy:
                    if sent is not message:
                        self.receiver.publish(message, None)
                    await self._push_stream(target, sent, stats, publish=sent is message)
                else:
                    self.receiver.publish(message, None)
                    stats.sent(await target.receiver.accept(sent, self.address,
                                                            peer_ids=self._me), message.round)
        except TimeoutError as exc:
            stats.connected = False
            raise PeerUnavailable(f"push of round {message.round} to {peer} timed out after "
                                  f"{timeout:.3g}s") from exc
        stats.answered(started)
        stats.messages_sent += 1

    async def _push_stream(
        self, target: MemoryTransport, message: RoundMessage, stats: PeerStats,
        publish: bool = True,
    ) -> None:
        stream = ChunkStream(await self._outgoing.get(message, publish))

        async def chunks() -> AsyncIterator[pb.StateChunk]:
            for chunk in stream:
                yield chunk

        try:
            await target.receiver.push(chunks(), peer=self.address, peer_ids=self._me)
        finally:
            stats.sent(stream.sent, message.round)

    def serve_agreement(
        self, serve: Callable[[str, AgreePhase, frozenset[str]], list[AgreeItem]]
    ) -> None:
        self.receiver.on_agree = serve

    async def agree(self, peer: str, phase: AgreePhase, have: Iterable[str],
                    timeout: float) -> list[AgreeItem]:
        """The agreement's request and reply through their protobuf bytes, as on the wire."""
        target = self._reach(peer)
        request = pb.AgreeRequest.FromString(
            request_of(self.identity.node_id, phase, have).SerializeToString())
        reply = target.receiver.agree(request, self.address, peer_ids=self._me)
        return read_reply(pb.AgreeReply.FromString(reply.SerializeToString()))

    async def exchange(self, peer: str, request: RoundMessage, timeout: float) -> RoundMessage:
        target = self._reach(peer)
        stats = self.stats[peer]
        started = time.perf_counter()
        expect = reply_expectation(peer, self.tensors, request, self.compressed)
        try:
            async with asyncio.timeout(timeout):
                await self._travel(request)
                target = self._reach(peer)  # (it may have gone meanwhile)
                if not self.network.copy:
                    reply = await target.desk.serve_message(request, self.address,
                                                            peer_ids=self._me)
                    check_message(expect, reply)
                else:
                    async def chunks() -> AsyncIterator[pb.StateChunk]:
                        for chunk in encode(request):
                            yield chunk

                    answer = await target.desk.serve(chunks(), self.address, peer_ids=self._me)
                    decoder = Decoder(expect)
                    for chunk in encode(answer):
                        decoder.take(chunk)
                    reply = decoder.finish()
                await self._travel(reply)
        except TimeoutError as exc:
            stats.connected = False
            raise PeerUnavailable(f"exchange {request.exchange_id} with {peer} timed out after "
                                  f"{timeout:.3g}s") from exc
        check_reply(request, reply)
        stats.sent(request.payload_bytes, request.round)
        stats.received(reply.payload_bytes, request.round)
        stats.answered(started)
        return reply

    async def _travel(self, message: RoundMessage) -> None:
        """The time ``message`` takes over a link of the network (none unless modelled)."""
        delay = self.network.link_delay
        if delay is not None:
            await asyncio.sleep(delay(message.payload_bytes))

    async def _pull(self, peer: str, request: pb.PullRequest, expect: Expectation,
                    timeout: float) -> RoundMessage:
        target = self._reach(peer)
        try:
            async with asyncio.timeout(timeout):
                if not self.network.copy:
                    message = target.receiver.published(request, self.address,
                                                        peer_ids=self._me)
                    check_message(expect, message)
                    target.receiver.served(request, message)
                    self.stats[peer].received(message.payload_bytes, int(request.round))
                    return message
                decoder = Decoder(expect)
                for chunk in target.receiver.pull(request, self.address, peer_ids=self._me):
                    decoder.take(chunk)
                    await asyncio.sleep(0)
                message = await asyncio.to_thread(decoder.finish)
        except TimeoutError as exc:
            raise PeerUnavailable(f"pull of round {request.round} from {peer} timed out after "
                                  f"{timeout:.3g}s") from exc
        self.stats[peer].received(decoder.received, int(request.round))
        return message
