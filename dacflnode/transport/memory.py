"""An in-process :class:`~dacflnode.transport.base.Transport`, for tests and simulations.

Nothing is shared between nodes but encoded chunks: a push encodes the message with the wire
codec and feeds the chunks through the *peer's* :class:`~dacflnode.transport.receiver.Receiver`,
exactly as the gRPC servicer does, so validation, logging, refusals and inbox handling are the
same code as on the network, and the receiving node gets its own copy of every tensor.

Fault injection: :meth:`MemoryNetwork.partition` cuts the link between two nodes (every call
between them raises :class:`~dacflnode.transport.base.PeerUnavailable`) until
:meth:`MemoryNetwork.heal`; a node that is stopped, or was never created, is unavailable too.

The helpers shared with the gRPC transport (:class:`HeaderCache`, :class:`PeerIdentity`,
:func:`hello_request`, :func:`check_identity`, :func:`pull_decoder`) live here
because this module, unlike ``grpc_transport``, can be imported without grpc.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Collection, Mapping
from dataclasses import dataclass, replace

from dacflnode._proto.dacfl.v1 import neighbor_pb2 as pb
from dacflnode.transport.base import (
    HandshakeRefused,
    Identity,
    Inbox,
    PeerStats,
    PeerUnavailable,
    Transport,
)
from dacflnode.transport.receiver import Receiver
from dacflnode.wire.codec import (
    Decoder,
    Expectation,
    RoundMessage,
    WireError,
    chunks,
    make_header,
)

#: Status codes with which a neighbour refuses a handshake (it is up, but will not talk to us).
HANDSHAKE_REFUSALS = frozenset({"FAILED_PRECONDITION", "PERMISSION_DENIED"})

DEFAULT_PULL_TIMEOUT = 30.0


@dataclass(frozen=True)
class PeerIdentity(Identity):
    """A neighbour's :class:`Identity` as its handshake reply gave it, with the round it is in."""

    round: int = 0


def hello_request(identity: Identity) -> pb.HelloRequest:
    return pb.HelloRequest(
        node_id=identity.node_id,
        protocol_version=identity.protocol_version,
        model_fingerprint=identity.model_fingerprint,
        run_fingerprint=identity.run_fingerprint,
    )


def check_identity(identity: Identity, peer: str, reply: pb.HelloReply) -> PeerIdentity:
    """The identity in ``reply``; raises :class:`HandshakeRefused` if this node must refuse it."""
    other = PeerIdentity(reply.node_id, reply.model_fingerprint, reply.run_fingerprint,
                         reply.protocol_version, int(reply.round))
    if other.node_id != peer:
        raise HandshakeRefused(f"the address of neighbour {peer!r} is served by {other.node_id!r}")
    reason = identity.mismatch(other)
    if reason is not None:
        raise HandshakeRefused(f"{identity.node_id} refuses {peer}: it runs {reason}")
    return other


def pull_decoder(peer: str, round_: int, tensors: Mapping[str, tuple[int, ...]]) -> Decoder:
    """A decoder that accepts only ``peer``'s state for ``round_``."""
    return Decoder(Expectation(
        senders={peer},
        tensors=tensors,
        accept_round=lambda r: None if r == round_ else f"round {round_} was asked for",
    ))


@dataclass(frozen=True)
class Outgoing:
    """A message ready to stream: its tensors in contiguous CPU memory, and its header."""

    message: RoundMessage
    header: pb.StateHeader


def on_cpu(message: RoundMessage) -> RoundMessage:
    """``message`` with every tensor contiguous in CPU memory (itself when it already is)."""
    if all(t.device.type == "cpu" and t.is_contiguous() for t in message.tensors.values()):
        return message
    tensors = {n: t.detach().to("cpu").contiguous() for n, t in message.tensors.items()}
    return replace(message, tensors=tensors)


class HeaderCache:
    """Prepares each outgoing message once, off the event loop, and publishes it.

    A node pushes the same :class:`RoundMessage` object to all its neighbours, concurrently;
    copying a GPU state to the host and hashing the payload once per neighbour would waste time
    on big models. Entries are keyed by ``(round, id(message))`` and hold the message, so an id
    cannot be reused while cached; only the newest ``keep`` rounds are kept. A message must not
    be mutated after its first push. Every prepared message is also handed to
    :meth:`Receiver.publish`, so neighbours can pull it.
    """

    def __init__(self, receiver: Receiver, keep: int = 2) -> None:
        self._receiver = receiver
        self._keep = keep
        self._entries: dict[tuple[int, int], tuple[RoundMessage, asyncio.Future[Outgoing]]]
        self._entries = {}

    async def get(self, message: RoundMessage) -> Outgoing:
        key = (message.round, id(message))
        entry = self._entries.get(key)
        if entry is None or entry[0] is not message:
            entry = (message, asyncio.ensure_future(self._prepare(message)))
            self._entries[key] = entry
            for old in [k for k in self._entries if k[0] <= message.round - self._keep]:
                del self._entries[old]
        try:
            # shielded: one pusher giving up must not cancel the work the others await
            return await asyncio.shield(entry[1])
        except asyncio.CancelledError:
            raise
        except Exception:
            if self._entries.get(key) is entry:
                del self._entries[key]
            raise

    async def _prepare(self, message: RoundMessage) -> Outgoing:
        def work() -> Outgoing:
            cpu = on_cpu(message)
            return Outgoing(cpu, make_header(cpu))

        out = await asyncio.to_thread(work)
        self._receiver.publish(out.message, out.header)
        return out


class MemoryNetwork:
    """The nodes of one in-process network, by id, and the links cut between them."""

    def __init__(self) -> None:
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
    """One node on a :class:`MemoryNetwork`."""

    def __init__(
        self,
        network: MemoryNetwork,
        identity: Identity,
        peers: Collection[str],
        inbox: Inbox,
        tensors: Mapping[str, tuple[int, ...]],
    ) -> None:
        self.network = network
        self.identity = identity
        self.peers = frozenset(peers)
        self.inbox = inbox
        self.tensors = dict(tensors)
        self.stats = {p: PeerStats() for p in sorted(self.peers)}
        self.receiver = Receiver(identity, inbox, self.tensors, self.stats)
        self.running = False
        self._outgoing = HeaderCache(self.receiver)
        network.add(self)

    @property
    def address(self) -> str:
        return f"memory:{self.identity.node_id}"

    async def start(self) -> None:
        self.network.add(self)  # a restarted node replaces its stopped predecessor
        self.running = True

    async def stop(self, grace: float = 1.0) -> None:
        self.running = False
        for stats in self.stats.values():
            stats.connected = False

    def _reach(self, peer: str) -> MemoryTransport:
        if peer not in self.peers:
            raise ValueError(f"{peer!r} is not a neighbour of {self.identity.node_id}")
        try:
            return self.network.reach(self.identity.node_id, peer)
        except PeerUnavailable:
            self.stats[peer].connected = False
            raise

    async def hello(self, peer: str) -> PeerIdentity:
        target = self._reach(peer)
        started = time.perf_counter()
        try:
            reply = target.receiver.hello(hello_request(self.identity))
        except WireError as exc:
            if exc.code in HANDSHAKE_REFUSALS:
                raise HandshakeRefused(exc.message) from exc
            raise PeerUnavailable(f"{peer}: {exc.code}: {exc.message}") from exc
        other = check_identity(self.identity, peer, reply)
        stats = self.stats[peer]
        stats.latency_ms = (time.perf_counter() - started) * 1000.0
        stats.connected = True
        return other

    async def push(self, peer: str, message: RoundMessage, timeout: float) -> None:
        target = self._reach(peer)
        out = await self._outgoing.get(message)
        stats = self.stats[peer]
        sent = 0

        async def stream() -> AsyncIterator[pb.StateChunk]:
            nonlocal sent
            yield pb.StateChunk(header=out.header)
            for chunk in chunks(out.message):
                sent += len(chunk.data)
                yield chunk

        started = time.perf_counter()
        try:
            async with asyncio.timeout(timeout):
                await target.receiver.push(stream(), peer=self.address)
        except TimeoutError as exc:
            stats.connected = False
            raise PeerUnavailable(f"push of round {message.round} to {peer} timed out after "
                                  f"{timeout:.3g}s") from exc
        finally:
            stats.bytes_sent += sent
        stats.latency_ms = (time.perf_counter() - started) * 1000.0
        stats.connected = True

    async def pull(
        self,
        peer: str,
        round_: int,
        expect_tensors: Mapping[str, tuple[int, ...]] | None = None,
        timeout: float = DEFAULT_PULL_TIMEOUT,
    ) -> RoundMessage:
        """The state ``peer`` published for ``round_``; raises :class:`PeerUnavailable` or
        :class:`WireError` (``NOT_FOUND`` if the peer does not keep that round)."""
        target = self._reach(peer)
        decoder = pull_decoder(peer, round_, self.tensors if expect_tensors is None
                               else expect_tensors)
        request = pb.PullRequest(requester=self.identity.node_id, round=round_)
        try:
            async with asyncio.timeout(timeout):
                for chunk in target.receiver.pull(request):
                    decoder.take(chunk)
                    await asyncio.sleep(0)
                message = await asyncio.to_thread(decoder.finish)
        except TimeoutError as exc:
            raise PeerUnavailable(f"pull of round {round_} from {peer} timed out after "
                                  f"{timeout:.3g}s") from exc
        self.stats[peer].bytes_received += decoder.received
        return message
