"""The serving side of the Neighbor protocol, independent of the transport.

Both transports hand incoming calls to a :class:`Receiver`: the gRPC servicer wraps it and turns
:class:`~dacflnode.wire.codec.WireError` into a gRPC status; the in-memory transport calls it
directly. So validation, logging and inbox handling are the same code on both.

Every refusal is logged with the peer, the round and the reason, and leaves the node's state
untouched: nothing reaches the inbox before the whole stream has been validated.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator, Mapping

from dacflnode._proto.dacfl.v1 import neighbor_pb2 as pb
from dacflnode.transport.base import Identity, Inbox, PeerStats
from dacflnode.wire.codec import Decoder, Expectation, RoundMessage, WireError, encode

log = logging.getLogger("dacflnode.transport")


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
        self.outbox: dict[int, tuple[RoundMessage, pb.StateHeader]] = {}

    # ------------------------------------------------------------------ Hello
    def hello(self, request: pb.HelloRequest) -> pb.HelloReply:
        other = Identity(request.node_id, request.model_fingerprint, request.run_fingerprint,
                         request.protocol_version)
        if request.node_id not in self.inbox.senders:
            log.warning("hello refused: %r is not a neighbour of %s", request.node_id,
                        self.identity.node_id)
            raise WireError("PERMISSION_DENIED",
                            f"{request.node_id!r} is not a neighbour of {self.identity.node_id}")
        reason = self.identity.mismatch(other)
        if reason is not None:
            log.error("hello from %s refused: it runs %s", request.node_id, reason)
            raise WireError("FAILED_PRECONDITION", f"{self.identity.node_id} refuses: {reason}")
        self.stats.setdefault(request.node_id, PeerStats()).connected = True
        return pb.HelloReply(
            node_id=self.identity.node_id,
            protocol_version=self.identity.protocol_version,
            model_fingerprint=self.identity.model_fingerprint,
            run_fingerprint=self.identity.run_fingerprint,
            round=self.inbox.current_round(),
        )

    # ------------------------------------------------------------------ PushState
    async def push(self, stream: AsyncIterator[pb.StateChunk], peer: str = "?") -> pb.PushReply:
        """Validate and assemble one pushed stream, then put it into the inbox."""
        decoder = Decoder(Expectation(senders=self.inbox.senders, tensors=self.tensors,
                                      accept_round=self.inbox.refusal))
        sender = "?"
        round_ = -1
        try:
            async for chunk in stream:
                if chunk.HasField("header"):
                    sender, round_ = chunk.header.sender, int(chunk.header.round)
                decoder.take(chunk)
            message = await asyncio.to_thread(decoder.finish)  # checksum: off the event loop
            await self.inbox.put(message)
        except WireError as exc:
            log.warning("push from %s (peer %s, round %d) refused: %s: %s", sender, peer,
                        round_, exc.code, exc.message)
            raise
        except ValueError as exc:  # the inbox moved on while the stream was arriving
            log.warning("push from %s round %d refused: %s", sender, round_, exc)
            raise WireError("FAILED_PRECONDITION", str(exc)) from exc
        stats = self.stats.setdefault(message.sender, PeerStats())
        stats.connected = True
        stats.last_round_received = max(stats.last_round_received, message.round)
        stats.bytes_received += decoder.received
        return pb.PushReply(round=message.round, received_bytes=decoder.received)

    # ------------------------------------------------------------------ PullState
    def publish(self, message: RoundMessage, header: pb.StateHeader, keep: int = 2) -> None:
        """Remember what this node sent for a round, so a neighbour can pull it again."""
        self.outbox[message.round] = (message, header)
        for r in sorted(self.outbox)[:-keep]:
            del self.outbox[r]

    def pull(self, request: pb.PullRequest) -> Iterator[pb.StateChunk]:
        if request.requester not in self.inbox.senders:
            log.warning("pull from %r (round %d) refused: not a neighbour of %s",
                        request.requester, request.round, self.identity.node_id)
            raise WireError("PERMISSION_DENIED", f"{request.requester!r} is not a neighbour")
        found = self.outbox.get(int(request.round))
        if found is None:
            log.warning("pull from %s refused: no state kept for round %d (kept: %s)",
                        request.requester, request.round, sorted(self.outbox))
            raise WireError("NOT_FOUND", f"no state kept for round {request.round}")
        message, header = found
        return encode(message, header=header)
