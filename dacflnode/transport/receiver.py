"""The serving side of the Neighbor protocol, independent of the transport.

Both transports hand incoming calls to a :class:`Receiver`: the gRPC servicer wraps it and turns
:class:`~dacflnode.wire.errors.WireError` into a gRPC status (with its
:class:`~dacflnode.wire.errors.Reason` in the trailing metadata); the in-memory transport calls it
directly. So validation, logging and inbox handling are the same code on both.

Every refusal is logged with the peer, the round and the reason, and leaves the node's state
untouched: nothing reaches the inbox before the whole stream has been validated.

The in-memory transport's no-copy mode hands over whole messages instead of streams
(:meth:`Receiver.accept` and :meth:`Receiver.published`): the same checks, in the same order,
with the same codes and reasons, on the fields of the tensors themselves.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator, Mapping

from dacflnode._proto.dacfl.v1 import neighbor_pb2 as pb
from dacflnode.transport.base import Identity, Inbox, PeerStats
from dacflnode.wire.codec import (
    Decoder,
    Expectation,
    RoundMessage,
    check_fields,
    dtype_name,
    encode,
    make_header,
)
from dacflnode.wire.errors import Reason, WireError

log = logging.getLogger("dacflnode.transport")


def check_message(expect: Expectation, message: RoundMessage) -> None:
    """Refuse ``message`` exactly as a :class:`Decoder` refuses a header announcing it: sender,
    round, degree, tensor names, dtypes and shapes (a whole message has no size or checksum to
    get wrong)."""
    if message.sender not in expect.senders:
        raise WireError("PERMISSION_DENIED", f"unknown sender {message.sender!r}",
                        Reason.UNKNOWN_SENDER)
    check_fields(expect, message.round, message.degree,
                 [(n, dtype_name(t), tuple(t.shape)) for n, t in message.tensors.items()])


class Receiver:
    """Answers Hello, PushState and PullState for one node."""

    def __init__(
        self,
        identity: Identity,
        inbox: Inbox,
        tensors: Mapping[str, tuple[int, ...]],
        stats: dict[str, PeerStats],
    ) -> None:
        self.identity = identity
        self.inbox = inbox
        self.tensors = dict(tensors)
        self.stats = stats
        #: What this node sent per round, for pulls; the header is ``None`` for a message
        #: published by the no-copy in-memory path (made when a stream is first asked for).
        self.outbox: dict[int, tuple[RoundMessage, pb.StateHeader | None]] = {}

    # ------------------------------------------------------------------ Hello
    def hello(self, request: pb.HelloRequest) -> pb.HelloReply:
        other = Identity(request.node_id, request.model_fingerprint, request.run_fingerprint,
                         request.protocol_version)
        if request.node_id not in self.inbox.senders:
            log.warning("hello refused: %r is not a neighbour of %s", request.node_id,
                        self.identity.node_id)
            raise WireError("PERMISSION_DENIED",
                            f"{request.node_id!r} is not a neighbour of {self.identity.node_id}",
                            Reason.NOT_NEIGHBOUR)
        why = self.identity.mismatch(other)
        if why is not None:
            log.error("hello from %s refused: it runs %s", request.node_id, why)
            raise WireError("FAILED_PRECONDITION", f"{self.identity.node_id} refuses: {why}",
                            Reason.MISMATCH)
        self.stats.setdefault(request.node_id, PeerStats()).connected = True
        return pb.HelloReply(
            node_id=self.identity.node_id,
            protocol_version=self.identity.protocol_version,
            model_fingerprint=self.identity.model_fingerprint,
            run_fingerprint=self.identity.run_fingerprint,
            round=self.inbox.current_round(),
        )

    # ------------------------------------------------------------------ PushState
    def _expectation(self) -> Expectation:
        return Expectation(senders=self.inbox.senders, tensors=self.tensors,
                           accept_round=self.inbox.refusal)

    async def push(self, stream: AsyncIterator[pb.StateChunk], peer: str = "?") -> pb.PushReply:
        """Validate and assemble one pushed stream, then put it into the inbox."""
        decoder = Decoder(self._expectation())
        sender = "?"
        round_ = -1
        try:
            async for chunk in stream:
                if chunk.HasField("header"):
                    sender, round_ = chunk.header.sender, int(chunk.header.round)
                decoder.take(chunk)
            message = await asyncio.to_thread(decoder.finish)  # checksum: off the event loop
            await self.inbox.put(message)  # refuses if the inbox moved on meanwhile
        except WireError as exc:
            self._log_refusal(sender, peer, round_, exc)
            raise
        self._received(message, decoder.received)
        return pb.PushReply(round=message.round, received_bytes=decoder.received)

    async def accept(self, message: RoundMessage, peer: str = "?") -> int:
        """Validate a whole ``message`` and put it into the inbox as it is (its tensors are
        not copied: the receiving node must treat them as read-only); returns its size."""
        try:
            check_message(self._expectation(), message)
            await self.inbox.put(message)
        except WireError as exc:
            self._log_refusal(message.sender, peer, message.round, exc)
            raise
        size = message.payload_bytes
        self._received(message, size)
        return size

    def _log_refusal(self, sender: str, peer: str, round_: int, exc: WireError) -> None:
        log.warning("push from %s (peer %s, round %d) refused: %s: %s (%s)", sender, peer,
                    round_, exc.code, exc.message, exc.reason)

    def _received(self, message: RoundMessage, size: int) -> None:
        stats = self.stats.setdefault(message.sender, PeerStats())
        stats.connected = True
        stats.last_round_received = max(stats.last_round_received, message.round)
        stats.bytes_received += size

    # ------------------------------------------------------------------ PullState
    def publish(
        self, message: RoundMessage, header: pb.StateHeader | None, keep: int = 2
    ) -> None:
        """Remember what this node sent for a round, so a neighbour can pull it again."""
        self.outbox[message.round] = (message, header)
        for r in sorted(self.outbox)[:-keep]:
            del self.outbox[r]

    def published(self, request: pb.PullRequest) -> RoundMessage:
        """The message kept for the requested round; raises :class:`WireError`
        (``PERMISSION_DENIED``/``NOT_NEIGHBOUR``, ``NOT_FOUND``/``NOT_KEPT``)."""
        if request.requester not in self.inbox.senders:
            log.warning("pull from %r (round %d) refused: not a neighbour of %s",
                        request.requester, request.round, self.identity.node_id)
            raise WireError("PERMISSION_DENIED", f"{request.requester!r} is not a neighbour",
                            Reason.NOT_NEIGHBOUR)
        found = self.outbox.get(int(request.round))
        if found is None:
            log.warning("pull from %s refused: no state kept for round %d (kept: %s)",
                        request.requester, request.round, sorted(self.outbox))
            raise WireError("NOT_FOUND", f"no state kept for round {request.round}",
                            Reason.NOT_KEPT)
        return found[0]

    def pull(self, request: pb.PullRequest) -> Iterator[pb.StateChunk]:
        """The stream of the message kept for the requested round (see :meth:`published`)."""
        message = self.published(request)
        header = self.outbox[message.round][1]
        if header is None:
            header = make_header(message)
            self.outbox[message.round] = (message, header)
        return encode(message, header=header)
