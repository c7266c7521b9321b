"""The serving side of an asynchronous exchange (the ``Exchange`` call), independent of the
transport; and what the calling side accepts as the answer.

An exchange (docs/algorithm.md, "Asynchronous DACFL") is one call: the asking node sends its
snapshot (an ``EXCHANGE`` state: ``omega`` and ``x``, ``round`` = its blocks, ``degree``, the
``exchange_id`` it chose) and gets back the transfer the answering node added (an
``EXCHANGED`` state: the same tensor set, ``round`` = the answering node's blocks, ``weight``).
A node that has trained its last block and has nothing left to ask tells each neighbour with an
``EXCHANGE_DONE`` header without tensors, answered by an empty ``EXCHANGED``. A node that
restarted from a checkpoint asks each neighbour for the edge's transfer totals with a
``RECONCILE`` header without tensors (``exchange_id``: the first of its new ids), answered by
the totals (``omega`` and ``x``) in an ``EXCHANGED`` state, or an ``EXCHANGE_DONE`` one when
the answering node asks for no more exchanges. A node that leaves the network hands each
neighbour its total of their edge in a ``HANDOVER`` state (``omega`` and ``x``), answered by an
empty ``EXCHANGED``.

The checks are the receiver's (:mod:`dacflnode.transport.receiver`), in the same order and
with the same codes: the caller's identity (a stranger gets the uniform refusal), the header
before any allocation (its kind must be one of the two requests, its tensors exactly the
model's float32 set, none for ``EXCHANGE_DONE``), the size, the checksum and finiteness, the
stream deadlines. At most :data:`MAX_EXCHANGES` exchanges of one neighbour are served at once
(an asking node has one in flight per edge; a retry may overlap the stalled call it replaces).
Only then is the node's own answer asked for (:attr:`Inbox.on_exchange
<dacflnode.transport.base.Inbox.on_exchange>`), which applies the transfer once per exchange
id and may refuse (a snapshot too stale, say) with a :class:`WireError` of its own; a node that
runs the synchronous schedule has none and refuses every exchange.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import AsyncIterator, Collection, Mapping

from dacflnode._proto.dacfl.v1 import neighbor_pb2 as pb
from dacflnode.transport.receiver import Assembler, Receiver, check_message
from dacflnode.transport.slots import Call
from dacflnode.wire.decoder import Decoder
from dacflnode.wire.errors import Reason, WireError
from dacflnode.wire.fast_path import Chunk
from dacflnode.wire.message import Kind, RoundMessage
from dacflnode.wire.validation import CompressedSpec, Expectation

log = logging.getLogger(__name__)

#: Exchanges of one neighbour served at once.
MAX_EXCHANGES = 2
#: The exchange requests that carry the model's tensors.
WITH_TENSORS = frozenset({Kind.EXCHANGE, Kind.HANDOVER})


def request_expectation(senders: Collection[str], tensors: Mapping[str, tuple[int, ...]],
                        kind: Kind, compressed: CompressedSpec | None = None) -> Expectation:
    """What an exchange request of ``kind`` must be: the model's float32 tensors for
    ``EXCHANGE`` and ``HANDOVER``, none for ``EXCHANGE_DONE`` and ``RECONCILE``; any block
    count. In a compressed run an ``EXCHANGE`` snapshot may come compressed
    (:mod:`dacflnode.protocol.async_compression`)."""
    if kind not in (Kind.EXCHANGE, Kind.EXCHANGE_DONE, Kind.RECONCILE, Kind.HANDOVER):
        raise WireError("INVALID_ARGUMENT", f"an exchange request of kind {kind.name}",
                        Reason.BAD_HEADER)
    return Expectation(senders=senders, tensors=tensors if kind in WITH_TENSORS else {},
                       kinds=(kind,), compressed=compressed if kind is Kind.EXCHANGE else None)


def reply_expectation(peer: str, tensors: Mapping[str, tuple[int, ...]],
                      request: RoundMessage,
                      compressed: CompressedSpec | None = None) -> Expectation:
    """What the answer to ``request`` from ``peer`` must be: an ``EXCHANGED`` state of the
    model's tensors (none when the request was ``EXCHANGE_DONE``; for ``RECONCILE``, the
    edge's totals in an ``EXCHANGED`` or ``EXCHANGE_DONE`` state)."""
    if request.kind is Kind.RECONCILE:
        return Expectation(senders=(peer,), tensors=tensors,
                           kinds=(Kind.EXCHANGED, Kind.EXCHANGE_DONE))
    return Expectation(senders=(peer,),
                       tensors=tensors if request.kind is Kind.EXCHANGE else {},
                       kinds=(Kind.EXCHANGED,),
                       compressed=compressed if request.kind is Kind.EXCHANGE else None)


def check_reply(request: RoundMessage, reply: RoundMessage) -> None:
    """The reply must answer this very exchange, with a usable weight."""
    if reply.exchange_id != request.exchange_id:
        raise WireError("INVALID_ARGUMENT", f"the answer to exchange {request.exchange_id} "
                        f"is for exchange {reply.exchange_id}", Reason.BAD_HEADER)
    if request.kind is Kind.EXCHANGE and not 0.0 < reply.weight <= 0.5:
        raise WireError("INVALID_ARGUMENT", f"an exchange weight of {reply.weight}",
                        Reason.BAD_HEADER)


class ExchangeDesk:
    """Serves the ``Exchange`` calls of one node, for either transport."""

    def __init__(self, receiver: Receiver) -> None:
        self.receiver = receiver
        self._serving: Counter[str] = Counter()

    def _hold(self, sender: str) -> None:
        if self._serving[sender] >= MAX_EXCHANGES:
            raise WireError("ABORTED", f"{MAX_EXCHANGES} exchanges of {sender} are being "
                            "served already", Reason.IN_PROGRESS)
        self._serving[sender] += 1

    def _let_go(self, sender: str) -> None:
        self._serving[sender] -= 1
        if self._serving[sender] <= 0:
            del self._serving[sender]

    async def _answer(self, message: RoundMessage) -> RoundMessage:
        handler = self.receiver.inbox.on_exchange
        if handler is None:
            raise WireError("FAILED_PRECONDITION", "this node runs the synchronous schedule: "
                            "it answers no exchange", Reason.MISMATCH)
        return await handler(message)

    async def serve(
        self, stream: AsyncIterator[Chunk], peer: str = "?", *,
        peer_ids: frozenset[str] | None = None, call: Call | None = None,
    ) -> RoundMessage:
        """Validate and assemble one exchange request from ``stream``, then answer it."""
        receiver = self.receiver
        call = call if call is not None else Call()
        sender, blocks = "?", -1
        held = False
        assembler: Assembler | None = None
        chunks = receiver.chunks(stream, call)
        try:
            try:
                async for chunk in chunks:
                    if assembler is None:
                        if not (isinstance(chunk, pb.StateChunk) and chunk.HasField("header")):
                            raise WireError("INVALID_ARGUMENT", "an exchange stream must "
                                            "begin with its header", Reason.BAD_HEADER)
                        header = chunk.header
                        sender, blocks = header.sender, int(header.round)
                        receiver.admit(sender, peer_ids, Reason.UNKNOWN_SENDER)
                        expect = request_expectation(receiver.inbox.senders, receiver.tensors,
                                                     _kind(int(header.kind)),
                                                     receiver.compressed)
                        self._hold(sender)
                        held = True
                        decoder = Decoder(expect)
                        assembler = Assembler(decoder, receiver.worker)
                        decoder.take(chunk)  # validates the header, then allocates
                        continue
                    await assembler.take(chunk)
                if assembler is None:
                    raise WireError("INVALID_ARGUMENT", "an exchange stream without a header",
                                    Reason.BAD_HEADER)
                call.touch()
                message = await assembler.finish()
            except asyncio.CancelledError:
                call.raise_if_cut()
                raise
            reply = await self._answer(message)
        except WireError as exc:
            if assembler is not None:
                assembler.release()
            receiver.refused("exchange", sender, peer, blocks, exc)
            raise
        except BaseException:
            if assembler is not None:
                assembler.release()
            raise
        finally:
            await chunks.aclose()
            if held:
                self._let_go(sender)
        receiver.exchanged(message, reply)
        return reply

    async def serve_message(self, message: RoundMessage, peer: str = "?", *,
                            peer_ids: frozenset[str] | None = None) -> RoundMessage:
        """Answer a whole request (the in-memory transport's no-copy path): the same checks."""
        receiver = self.receiver
        held = False
        try:
            receiver.admit(message.sender, peer_ids, Reason.UNKNOWN_SENDER)
            check_message(request_expectation(receiver.inbox.senders, receiver.tensors,
                                              _kind(int(message.kind)), receiver.compressed),
                          message)
            self._hold(message.sender)
            held = True
            reply = await self._answer(message)
        except WireError as exc:
            receiver.refused("exchange", message.sender, peer, message.round, exc)
            raise
        finally:
            if held:
                self._let_go(message.sender)
        receiver.exchanged(message, reply)
        return reply


def _kind(value: int) -> Kind:
    try:
        return Kind(value)
    except ValueError:
        raise WireError("INVALID_ARGUMENT", f"unknown state kind {value}",
                        Reason.BAD_HEADER) from None
