"""The serving side of the Neighbor protocol, independent of the transport.

Both transports hand incoming calls to a :class:`Receiver`: the gRPC servicer wraps it and turns
:class:`~dacflnode.wire.errors.WireError` into a gRPC status (with its
:class:`~dacflnode.wire.errors.Reason` in the trailing metadata); the in-memory transport calls it
directly. So validation, logging and inbox handling are the same code on both.

Every refusal is logged with the peer, the round and the reason (values a peer chose are
written with ``%r``, so they cannot forge a log line), counted in :attr:`Receiver.refusals`, and
leaves the node's state untouched: nothing reaches the inbox before the whole stream has been
validated. The checks, in order:

1. Identity. ``peer_ids`` are the identities the transport authenticated (the DNS names of a
   verified client certificate; the in-memory transport knows its caller). When given, the
   ``sender`` of a push, the ``requester`` of a pull and the ``node_id`` of a Hello must be one
   of them (else :attr:`~Reason.NOT_AUTHENTICATED`), and must be a configured neighbour (else
   :attr:`~Reason.UNKNOWN_SENDER` or :attr:`~Reason.NOT_NEIGHBOUR`). ``None`` means an
   unauthenticated transport: only the neighbour check applies. A stranger gets one short,
   uniform answer, ``PERMISSION_DENIED`` "refused", before anything else is looked at: no
   member names, rounds or shapes. Its reason names only what the caller got wrong about
   itself (it claimed an id it did not authenticate as, or it is not a neighbour), so it says
   nothing about who the members are. Only the log keeps the details.
2. One state per sender and round: a state the inbox already holds is refused
   (``ALREADY_EXISTS``, :attr:`~Reason.DUPLICATE`: nothing to retry). Up to
   :data:`MAX_CANDIDATES` (2) streams of the same sender and round may arrive at once, and the
   first that completes and validates is kept (the others are then cut as duplicates), so a
   stalled stream in a neighbour's name cannot hold the real one back. A further stream takes
   the place of the stalest one when that one has sent nothing for ``first_message_timeout``
   seconds (which is cut: ``RESOURCE_EXHAUSTED``, :attr:`~Reason.PREEMPTED`); otherwise it is
   refused at its header (``ABORTED``, :attr:`~Reason.IN_PROGRESS`: retry later). So a node
   holds at most two receive buffers per neighbour and accepted round (briefly one more while
   a preempted stream lets go of its own), however many streams are opened.
3. The header (round, degree, names, dtypes, shapes, size) before any allocation, then size,
   the trailer's checksum and finiteness (``INVALID_ARGUMENT``, :attr:`~Reason.NON_FINITE`;
   hashed and summed chunk by chunk off the event loop), then the inbox's guard against
   absurd states (:mod:`dacflnode.wire.state_guard`).
4. Deadlines. A push stream that sends no header for ``first_message_timeout`` seconds
   (:data:`FIRST_MESSAGE_TIMEOUT`), no chunk for ``idle_timeout`` seconds
   (:data:`IDLE_TIMEOUT`) or has not ended after ``stream_timeout`` seconds
   (:data:`STREAM_TIMEOUT`) is cut with ``RESOURCE_EXHAUSTED`` and reason
   :attr:`~Reason.IDLE` or :attr:`~Reason.TOO_SLOW`, and its buffer is released. The code is
   deliberately not ``DEADLINE_EXCEEDED`` or ``UNAVAILABLE``: a sender reads those as "the peer
   is unreachable", and this peer is reachable, it refused a stream that used up its time.

The in-memory transport's no-copy mode hands over whole messages instead of streams
(:meth:`Receiver.accept` and :meth:`Receiver.published`): the same checks, in the same order,
with the same codes and reasons, on the fields of the tensors themselves.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import Counter, deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator, Mapping
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import TypeVar

from dacflnode._proto.dacfl.v1 import neighbor_pb2 as pb
from dacflnode.config import DAEMON_DEFAULTS
from dacflnode.transport.base import Identity, Inbox, PeerStats
from dacflnode.transport.slots import Call, release
from dacflnode.wire.agreement import AgreeItem, AgreePhase, read_request, reply_of
from dacflnode.wire.buffers import BufferPool
from dacflnode.wire.decoder import Decoder
from dacflnode.wire.encoder import encode, make_header, serialized_chunks
from dacflnode.wire.errors import STRANGER_MESSAGE, Reason, WireError
from dacflnode.wire.fast_path import Chunk, serialize_chunk
from dacflnode.wire.message import RoundMessage, dtype_name
from dacflnode.wire.validation import (
    CompressedSpec,
    Expectation,
    check_copy,
    check_fields,
    check_finite,
    check_log,
)

log = logging.getLogger(__name__)
_T = TypeVar("_T")

#: Seconds a push stream may send nothing before it is cut (a healthy sender writes a 1 MiB
#: chunk far more often; a stalled one holds a receive buffer as long as this). Declared with
#: the node's settings (``run.stream_idle_timeout`` of a peers file).
IDLE_TIMEOUT = DAEMON_DEFAULTS.stream_idle_timeout
#: Seconds a whole push stream may take, header to end (bounds how long a stream that trickles
#: a byte now and then can hold its buffer; generous for a large model on a slow link).
#: ``run.stream_timeout`` of a peers file.
STREAM_TIMEOUT = DAEMON_DEFAULTS.stream_timeout
#: Seconds a push stream may take to send its header (a few hundred bytes): a stream that sends
#: nothing holds a call slot this long at most. ``run.first_message_timeout`` of a peers file.
FIRST_MESSAGE_TIMEOUT = DAEMON_DEFAULTS.first_message_timeout
#: Streams of the same sender and round received at once (see the module docstring).
MAX_CANDIDATES = 2


#: Data chunks of at least this many bytes are written by the receiver's worker thread; smaller
#: ones on the event loop (handing them over would cost more than writing them).
OFFLOAD_BYTES = 64 * 1024
#: At most this many chunks of one stream wait for the worker (each holds its received bytes);
#: a stream that gets further ahead waits for the oldest.
MAX_QUEUED = 2
#: Refusals that are part of an asynchronous run's course, logged as information: a snapshot
#: too stale, a node that has ended, an edge not reconciled yet after a restart, an exchange
#: of a process that has since restarted.
_ROUTINE = frozenset({Reason.STALE, Reason.FINISHED, Reason.RECONCILING, Reason.RESTARTED})
#: Refusals that show the caller alive, only in another round (docs/faults.md: slow is not gone).
_ALIVE = frozenset({Reason.ROUND_PASSED, Reason.ROUND_AHEAD, Reason.DUPLICATE,
                    Reason.IN_PROGRESS})


class Assembler:
    """Drives a :class:`Decoder` from the event loop.

    Every chunk is checked, and a data chunk's place reserved, on the loop, in stream order, so
    refusals come at the same chunk as with :meth:`Decoder.take`. A large data chunk is then
    written (copy into the buffer, hash, float sum: all without the GIL) by ``worker``, a
    single thread, so the writes stay in order, while the loop receives the next chunks; the
    loop pays a queue put per chunk and waits only when :data:`MAX_QUEUED` chunks are behind,
    and before :meth:`finish`. Without a worker (or once it is shut down) chunks are written on
    the loop.
    """

    def __init__(self, decoder: Decoder, worker: Executor | None = None) -> None:
        self.decoder = decoder
        self.worker = worker
        self._queued: deque[Future[None]] = deque()

    async def take(self, chunk: Chunk) -> None:
        """:meth:`Decoder.take`, raising the same refusals at the same chunk."""
        if (self.worker is not None and isinstance(chunk, memoryview)
                and chunk.nbytes >= OFFLOAD_BYTES):
            offset = self.decoder.reserve(chunk)
            queued = self._queued
            while queued and queued[0].done():
                queued.popleft().result()  # a write that failed raises here
            if len(queued) >= MAX_QUEUED:
                await asyncio.wrap_future(queued.popleft())
            try:
                queued.append(self.worker.submit(self.decoder.write, offset, chunk))
            except RuntimeError:  # the worker was shut down (the transport stops)
                await self.settle()
                self.decoder.write(offset, chunk)
            return
        await self.settle()
        self.decoder.take(chunk)

    async def settle(self) -> None:
        """Wait until every write handed to the worker is done."""
        queued = self._queued
        if queued:
            await asyncio.wrap_future(queued[-1])  # one thread: the last one is the latest
            while queued:
                queued.popleft().result()

    async def finish(self) -> RoundMessage:
        """:meth:`Decoder.finish` after the last write: on the event loop when every sum was
        finite (no pass over the payload is left), else in a worker thread."""
        await self.settle()
        if self.decoder.summed:
            return self.decoder.finish()
        return await asyncio.to_thread(self.decoder.finish)

    def release(self) -> None:
        """Drop the buffer of a refused stream (writes still queued find it gone; one in
        progress finishes into its own references to it)."""
        self._queued.clear()
        self.decoder.release()


def check_message(expect: Expectation, message: RoundMessage) -> None:
    """Refuse ``message`` exactly as a :class:`Decoder` refuses a stream carrying it: sender,
    round, degree, tensor names, dtypes and shapes, then finiteness (a whole message has no
    size or checksum to get wrong)."""
    if message.sender not in expect.senders:
        raise WireError("PERMISSION_DENIED", STRANGER_MESSAGE, Reason.UNKNOWN_SENDER,
                        detail=f"unknown sender {message.sender!r}")
    check_fields(expect, message.round, message.degree,
                 [(n, dtype_name(t), tuple(t.shape)) for n, t in message.tensors.items()])
    check_log(expect, message.round, int(message.kind), message.used_log, message.anchors)
    check_copy(expect, message.copy_next)
    check_finite(message.tensors)


def _stranger(reason: Reason, detail: str) -> WireError:
    return WireError("PERMISSION_DENIED", STRANGER_MESSAGE, reason, detail=detail)


class Receiver:
    """Answers Hello, PushState and PullState for one node.

    ``refusals`` counts every refusal by reason (status and metrics read it); ``refused_by``
    counts them by the neighbour the call claimed to come from, ``late_by`` the pushes refused
    because this node had left their round (only configured neighbours are counted there, so
    strangers cannot grow them); ``idle_timeout`` and ``stream_timeout`` are the push-stream
    deadlines (see the module docstring). ``compressed`` is a compressed run's tensor set
    (part name -> dtype, shape): pushes and state pulls then carry it or the float32 set.
    """

    def __init__(
        self,
        identity: Identity,
        inbox: Inbox,
        tensors: Mapping[str, tuple[int, ...]],
        stats: dict[str, PeerStats],
        *,
        compressed: CompressedSpec | None = None,
        idle_timeout: float = IDLE_TIMEOUT,
        stream_timeout: float = STREAM_TIMEOUT,
        first_message_timeout: float = FIRST_MESSAGE_TIMEOUT,
    ) -> None:
        self.identity = identity
        self.inbox = inbox
        self.tensors = dict(tensors)
        self.compressed = None if compressed is None else dict(compressed)
        self.stats = stats
        self.idle_timeout = idle_timeout
        self.stream_timeout = stream_timeout
        self.first_message_timeout = first_message_timeout
        self.refusals: Counter[Reason] = Counter()
        self.refused_by: Counter[str] = Counter()
        self.late_by: Counter[str] = Counter()
        #: A table run's feature agreement (:mod:`dacflnode.protocol.scale_agreement`): the
        #: items of a phase that a neighbour lacks, by ``(sender, phase, have)``; ``None``:
        #: none yet (a neighbour that asks gets no items and asks again)
        self.on_agree: Callable[[str, AgreePhase, frozenset[str]], list[AgreeItem]] | None = None
        #: What this node sent per round, for pulls; the header is ``None`` for a message
        #: published by the no-copy in-memory path (made when a stream is first asked for).
        self.outbox: dict[int, tuple[RoundMessage, pb.StateHeader | None]] = {}
        #: The push streams being received now, by ``(sender, round)`` (oldest first).
        self._receiving: dict[tuple[str, int], list[Call]] = {}
        #: Receive buffers for reuse: one per neighbour and round of the inbox window.
        self.pool = BufferPool(keep=2 * max(1, len(inbox.senders)))
        #: Writes received chunks into their buffers (see :class:`Assembler`); its thread
        #: starts with the first large chunk and ends with :meth:`close`.
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dacfl-receive")

    def close(self) -> None:
        """End the worker thread once the writes queued so far are done (later streams are
        written on the event loop)."""
        self.worker.shutdown(wait=False)

    # ------------------------------------------------------------------ checks
    def _admit(self, claimed: str, peer_ids: frozenset[str] | None, stranger: Reason) -> None:
        """Refuse a caller who is not the neighbour ``claimed`` (see the module docstring)."""
        if peer_ids is not None and claimed not in peer_ids:
            shown = sorted(peer_ids)[:4]
            raise _stranger(Reason.NOT_AUTHENTICATED,
                            f"claims to be {claimed!r} but authenticated as {shown!r}")
        if claimed not in self.inbox.senders:
            raise _stranger(stranger, f"{claimed!r} is not a neighbour")

    def admit(self, claimed: str, peer_ids: frozenset[str] | None, stranger: Reason) -> None:
        """Refuse a caller who is not the neighbour ``claimed`` (for the exchange desk)."""
        self._admit(claimed, peer_ids, stranger)

    def chunks(self, stream: AsyncIterator[Chunk], call: Call) -> AsyncGenerator[Chunk, None]:
        """The chunks of ``stream`` under the push streams' deadlines (for the exchange
        desk)."""
        return self._chunks(stream, call)

    def exchanged(self, request: RoundMessage, reply: RoundMessage) -> None:
        """Count an exchange this node answered: the request's bytes in, the reply's out."""
        self.inbox.heard_from(request.sender)
        stats = self.stats.setdefault(request.sender, PeerStats())
        stats.connected = True
        stats.last_round_received = max(stats.last_round_received, request.round)
        blocks = self.inbox.current_round()
        stats.received(request.payload_bytes, blocks)
        stats.sent(reply.payload_bytes, blocks)

    def refused(self, call: str, who: str, peer: str, round_: int, exc: WireError) -> None:
        """Count and log a refusal made outside the receiver's own checks (a call slot)."""
        self._refused(call, who, peer, round_, exc)

    def _refused(self, call: str, who: str, peer: str, round_: int, exc: WireError) -> None:
        self.refusals[exc.reason] += 1
        if exc.reason in _ALIVE:
            self.inbox.heard_from(who)
        if who in self.inbox.senders:
            self.refused_by[who] += 1
            if call == "push" and exc.reason is Reason.ROUND_PASSED:
                self.late_by[who] += 1
        level = logging.INFO if exc.reason in _ROUTINE else logging.WARNING
        log.log(level, "%s from %r (peer %r, round %d) refused: %s: %s (%s)", call, who, peer,
                round_, exc.code, exc.detail, exc.reason,
                extra={"event": f"{call}_refused", "round": round_ if round_ >= 0 else None,
                       "neighbour": who, "reason": exc.reason})

    # ------------------------------------------------------------------ Hello
    def hello(
        self, request: pb.HelloRequest, peer: str = "?", *,
        peer_ids: frozenset[str] | None = None,
    ) -> pb.HelloReply:
        other = Identity(request.node_id, request.model_fingerprint, request.run_fingerprint,
                         request.protocol_version, data_contract=request.data_contract)
        try:
            self._admit(request.node_id, peer_ids, Reason.NOT_NEIGHBOUR)
            why = self.identity.mismatch(other)
            if why is not None:
                raise WireError("FAILED_PRECONDITION",
                                f"{self.identity.node_id} refuses {request.node_id}: {why}",
                                Reason.MISMATCH)
        except WireError as exc:
            self._refused("hello", request.node_id, peer, -1, exc)
            raise
        self.stats.setdefault(request.node_id, PeerStats()).connected = True
        self.inbox.heard_from(request.node_id)
        on_join = self.inbox.on_join
        join_round = 0 if on_join is None else on_join(request.node_id, int(request.join_round))
        return pb.HelloReply(
            node_id=self.identity.node_id,
            protocol_version=self.identity.protocol_version,
            model_fingerprint=self.identity.model_fingerprint,
            run_fingerprint=self.identity.run_fingerprint,
            round=self.inbox.current_round(),
            join_round=join_round,
            data_contract=self.identity.data_contract,
        )

    # ------------------------------------------------------------------ Agree
    def agree(self, request: pb.AgreeRequest, peer: str = "?", *,
              peer_ids: frozenset[str] | None = None) -> pb.AgreeReply:
        """The items of the feature agreement's phase that the neighbour lacks."""
        try:
            self._admit(request.sender, peer_ids, Reason.NOT_NEIGHBOUR)
            phase, have = read_request(request)
        except WireError as exc:
            self._refused("agree", request.sender, peer, -1, exc)
            raise
        self.inbox.heard_from(request.sender)
        serve = self.on_agree
        return reply_of(() if serve is None else serve(request.sender, phase, have))

    # ------------------------------------------------------------------ PushState
    def _expectation(self) -> Expectation:
        return Expectation(senders=self.inbox.senders, tensors=self.tensors,
                           accept_round=self.inbox.refusal, compressed=self.compressed)

    def _reserve(self, sender: str, round_: int, call: Call) -> tuple[str, int]:
        """Count ``call`` as a stream of ``(sender, round_)``; refuses a duplicate, or one
        more stream while :data:`MAX_CANDIDATES` are arriving and none of them has stalled
        (a stalled one is cut to make room)."""
        key = (sender, round_)
        if self.inbox.has(round_, sender):
            raise WireError("ALREADY_EXISTS", f"the state of {sender} for round {round_} was "
                            "received already", Reason.DUPLICATE)
        streams = self._receiving.setdefault(key, [])
        if len(streams) >= MAX_CANDIDATES:
            stalest = min(streams, key=lambda c: c.last)
            stalled = stalest.idle()
            if stalled < self.first_message_timeout:
                raise WireError("ABORTED", f"a state of {sender} for round {round_} is being "
                                "received on two other streams", Reason.IN_PROGRESS)
            streams.remove(stalest)
            stalest.cut(WireError(
                "RESOURCE_EXHAUSTED", f"this stream of the state of {sender} for round "
                f"{round_} sent nothing for {stalled:.3g}s and a newer one took its place",
                Reason.PREEMPTED))
        streams.append(call)
        return key

    def _kept(self, key: tuple[str, int], call: Call) -> None:
        """The stream ``call`` of ``key`` was accepted: cut the others, duplicates now."""
        for other in self._receiving.pop(key, []):
            if other is not call:
                other.cut(WireError("ALREADY_EXISTS", f"the state of {key[0]} for round "
                                    f"{key[1]} was received already", Reason.DUPLICATE))

    async def _chunks(self, stream: AsyncIterator[Chunk],
                      call: Call) -> AsyncGenerator[Chunk, None]:
        """The chunks of ``stream``, cut with ``RESOURCE_EXHAUSTED`` (:attr:`~Reason.IDLE`,
        :attr:`~Reason.TOO_SLOW`) at the first-message, idle or total deadline."""
        loop = asyncio.get_running_loop()
        end = loop.time() + self.stream_timeout
        chunks = aiter(stream)
        first = True
        while True:
            left = end - loop.time()
            idle = self.first_message_timeout if first else self.idle_timeout
            wait = min(idle, left)
            try:
                async with asyncio.timeout(max(wait, 0.0)):
                    chunk = await anext(chunks)
            except StopAsyncIteration:
                return
            except TimeoutError:
                if wait >= left:
                    raise WireError("RESOURCE_EXHAUSTED", "the stream did not complete within "
                                    f"{self.stream_timeout:.3g}s", Reason.TOO_SLOW) from None
                if first:
                    raise WireError("RESOURCE_EXHAUSTED", "the stream sent no header within "
                                    f"{idle:.3g}s", Reason.IDLE) from None
                raise WireError("RESOURCE_EXHAUSTED", "the stream sent nothing for "
                                f"{idle:.3g}s", Reason.IDLE) from None
            first = False
            call.touch()
            yield chunk

    async def push(
        self, stream: AsyncIterator[Chunk], peer: str = "?", *,
        peer_ids: frozenset[str] | None = None, call: Call | None = None,
    ) -> pb.PushReply:
        """Validate and assemble one pushed stream, then put it into the inbox. The chunks
        are messages, or data payloads as :func:`~dacflnode.wire.fast_path.parse_chunk` returns
        them. ``call`` is the stream's :class:`~dacflnode.transport.slots.Call` (made here
        when not given): whoever cuts it ends the stream with the error it was cut with."""
        if call is None:
            call = Call()
        decoder = Decoder(self._expectation(), pool=self.pool)
        assembler = Assembler(decoder, self.worker)
        sender = "?"
        round_ = -1
        key: tuple[str, int] | None = None
        chunks = self._chunks(stream, call)
        try:
            try:
                async for chunk in chunks:
                    if (key is None and isinstance(chunk, pb.StateChunk)
                            and chunk.HasField("header")):
                        sender, round_ = chunk.header.sender, int(chunk.header.round)
                        self._admit(sender, peer_ids, Reason.UNKNOWN_SENDER)
                        key = self._reserve(sender, round_, call)
                        decoder.take(chunk)  # validates the header, then allocates
                        continue
                    await assembler.take(chunk)
                call.touch()  # the sender is done; checking is this node's time
                message = await assembler.finish()  # trailer, checksum, finiteness
                await self.inbox.put(message)  # guard, duplicate, and the round moving on
            except asyncio.CancelledError:
                call.raise_if_cut()
                raise
        except WireError as exc:
            assembler.release()
            self._refused("push", sender, peer, round_, exc)
            raise
        except BaseException:
            assembler.release()
            raise
        finally:
            await chunks.aclose()
            if key is not None:
                release(self._receiving, key, call)
        if key is not None:  # (always: a message was assembled, so its header was read)
            self._kept(key, call)
        self._received(message, decoder.received)
        return pb.PushReply(round=message.round, received_bytes=decoder.received)

    async def accept(
        self, message: RoundMessage, peer: str = "?", *,
        peer_ids: frozenset[str] | None = None,
    ) -> int:
        """Validate a whole ``message`` and put it into the inbox as it is (its tensors are
        not copied: the receiving node must treat them as read-only); returns its size."""
        try:
            self._admit(message.sender, peer_ids, Reason.UNKNOWN_SENDER)
            check_message(self._expectation(), message)
            await self.inbox.put(message)
        except WireError as exc:
            self._refused("push", message.sender, peer, message.round, exc)
            raise
        size = message.payload_bytes
        self._received(message, size)
        return size

    def _received(self, message: RoundMessage, size: int) -> None:
        self.inbox.heard_from(message.sender)
        stats = self.stats.setdefault(message.sender, PeerStats())
        stats.connected = True
        stats.last_round_received = max(stats.last_round_received, message.round)
        stats.received(size, message.round)

    # ------------------------------------------------------------------ PullState
    def publish(
        self, message: RoundMessage, header: pb.StateHeader | None, keep: int = 2
    ) -> None:
        """Remember what this node sent for a round, so a neighbour can pull it again."""
        self.outbox[message.round] = (message, header)
        for r in sorted(self.outbox)[:-keep]:
            del self.outbox[r]

    def published(
        self, request: pb.PullRequest, peer: str = "?", *,
        peer_ids: frozenset[str] | None = None,
    ) -> RoundMessage:
        """The message kept for the requested round, or the public copy of the requested
        ``copy_id`` (from :attr:`Inbox.copy_of`); raises :class:`WireError`
        (``PERMISSION_DENIED`` to a stranger, ``NOT_FOUND``/``NOT_KEPT``)."""
        copy_id = int(request.copy_id)
        try:
            self._admit(request.requester, peer_ids, Reason.NOT_NEIGHBOUR)
            self.inbox.heard_from(request.requester)
            if copy_id:
                copy_of = self.inbox.copy_of
                copy = None if copy_of is None else copy_of(copy_id)
                if copy is None:
                    raise WireError("NOT_FOUND", f"no public copy {copy_id} kept",
                                    Reason.NOT_KEPT)
                return copy
            found = self.outbox.get(int(request.round))
            if found is None:
                raise WireError("NOT_FOUND", f"no state kept for round {request.round} "
                                f"(kept: {sorted(self.outbox)})", Reason.NOT_KEPT)
        except WireError as exc:
            self._refused("copy pull" if copy_id else "pull", request.requester, peer,
                          int(request.round), exc)
            raise
        return self.inbox.sent_to(request.requester, found[0])

    def served(self, request: pb.PullRequest, message: RoundMessage) -> None:
        """Count ``message``, sent whole in answer to the pull ``request`` (for the round the
        request names)."""
        self.stats.setdefault(request.requester, PeerStats()).sent(message.payload_bytes,
                                                                    int(request.round))

    def _serving(self, request: pb.PullRequest, message: RoundMessage,
                 stream: Iterator[_T]) -> Iterator[_T]:
        """``stream``, and :meth:`served` once its last chunk has been taken."""
        yield from stream
        self.served(request, message)

    def pull(
        self, request: pb.PullRequest, peer: str = "?", *,
        peer_ids: frozenset[str] | None = None,
    ) -> Iterator[pb.StateChunk]:
        """The stream of the message kept for the requested round (see :meth:`published`)."""
        message = self.published(request, peer, peer_ids=peer_ids)
        return self._serving(request, message,
                             encode(message, header=self._header_of(message)))

    def pull_serialized(
        self, request: pb.PullRequest, peer: str = "?", *,
        peer_ids: frozenset[str] | None = None,
    ) -> Iterator[bytes]:
        """:meth:`pull`, serialized for gRPC (the data chunks made with one copy each)."""
        message = self.published(request, peer, peer_ids=peer_ids)
        header = serialize_chunk(pb.StateChunk(header=self._header_of(message)))
        return self._serving(request, message,
                             itertools.chain((header,), serialized_chunks(message)))

    def _header_of(self, message: RoundMessage) -> pb.StateHeader:
        kept, header = self.outbox.get(message.round, (None, None))
        if kept is not message:  # a copy, or what one neighbour is sent instead (outgoing)
            return make_header(message)
        if header is None:
            header = make_header(message)
            self.outbox[message.round] = (message, header)
        return header
