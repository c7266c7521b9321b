"""Outgoing states, shared by both transports: prepared once per message, streamed per neighbour.

A node pushes the same :class:`~dacflnode.wire.message.RoundMessage` to all its neighbours,
concurrently. :class:`HeaderCache` prepares it once (host copy, contiguous tensors, header)
off the event loop, and :class:`ChunkStream` streams the prepared state to one neighbour,
hashing each chunk as it makes it (the checksum is the stream's trailer), counting what it
handed out. The first stream that completes keeps the checksum with the prepared message, so
later streams of it (further neighbours, retries) do not hash again. Over gRPC the next chunk
is made in a worker thread while the current one is sent (:meth:`ChunkStream.prefetched`). See
docs/wire-format.md for the stream layout.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncGenerator, Iterator
from dataclasses import dataclass, replace

import xxhash

from dacflnode._proto.dacfl.v1 import neighbor_pb2 as pb
from dacflnode.transport.base import TransportClosed, cancelled_by_caller
from dacflnode.transport.receiver import Receiver
from dacflnode.wire.encoder import SerializedStream, chunks, make_header, trailer_chunk
from dacflnode.wire.fast_path import serialize_chunk
from dacflnode.wire.message import CHUNK_BYTES, RoundMessage

#: A stream of at least this many payload bytes makes its chunks in a worker thread (see
#: :meth:`ChunkStream.prefetched`); a smaller one on the event loop (the hand-over would cost
#: more than the copy).
PREFETCH_BYTES = CHUNK_BYTES


@dataclass
class Outgoing:
    """A message ready to stream: its tensors in contiguous CPU memory, and its header;
    ``trailer`` is its payload's checksum once a stream of it has computed it."""

    message: RoundMessage
    header: pb.StateHeader
    trailer: bytes | None = None

    @functools.cached_property
    def header_bytes(self) -> bytes:
        """The serialized header chunk (made once, sent to every neighbour)."""
        return serialize_chunk(pb.StateChunk(header=self.header))


def on_cpu(message: RoundMessage) -> RoundMessage:
    """``message`` with every tensor contiguous in CPU memory (itself when it already is)."""
    if all(t.device.type == "cpu" and t.is_contiguous() for t in message.tensors.values()):
        return message
    tensors = {n: t.detach().to("cpu").contiguous() for n, t in message.tensors.items()}
    return replace(message, tensors=tensors)


class ChunkStream:
    """One neighbour's copy of the stream of a prepared message: the header, the payload, then
    the trailer.

    :attr:`sent` counts the payload bytes handed out so far, so a push that fails half-way
    still accounts for what it sent.
    """

    def __init__(self, out: Outgoing) -> None:
        self.out = out
        self._sent = 0
        self._stream: SerializedStream | None = None

    @property
    def sent(self) -> int:
        return self._sent if self._stream is None else self._stream.sent

    def __iter__(self) -> Iterator[pb.StateChunk]:
        yield pb.StateChunk(header=self.out.header)
        digest = self.out.trailer
        hashing = xxhash.xxh3_128() if digest is None else None
        for chunk in chunks(self.out.message):
            if hashing is not None:
                hashing.update(chunk.data)
            self._sent += len(chunk.data)
            yield chunk
        if hashing is not None:
            digest = self.out.trailer = hashing.digest()
        assert digest is not None
        yield trailer_chunk(digest)

    def _serialized_stream(self) -> SerializedStream:
        self._stream = SerializedStream(self.out.message, digest=self.out.trailer)
        return self._stream

    def _done(self, stream: SerializedStream) -> None:
        if self.out.trailer is None:
            self.out.trailer = stream.digest

    def serialized(self) -> Iterator[bytes]:
        """The same stream, serialized as gRPC sends it: the header made once per message,
        each data chunk made with one copy of its slice of the tensors and hashed from that
        copy, then the trailer."""
        yield self.out.header_bytes
        stream = self._serialized_stream()
        yield from stream
        self._done(stream)

    async def prefetched(self) -> AsyncGenerator[bytes, None]:
        """:meth:`serialized`, with each chunk made (copied and hashed, without the GIL) in
        a worker thread while the caller sends the one before: the copy and the hash overlap
        the transfer instead of adding to it. A small message is made on the event loop."""
        if self.out.message.payload_bytes < PREFETCH_BYTES:
            for small in self.serialized():
                yield small
            return
        stream = self._serialized_stream()
        loop = asyncio.get_running_loop()
        pending = loop.run_in_executor(None, stream.next_chunk)  # made while the header goes
        try:
            yield self.out.header_bytes
            while (data := await pending) is not None:
                pending = loop.run_in_executor(None, stream.next_chunk)
                yield data
                del data  # the serializer reuses the buffer once nothing holds it
        finally:
            if not pending.done():  # the caller stopped early: let the last one finish alone
                pending.add_done_callback(_retrieve_any)
        self._done(stream)


def _retrieve_any(future: asyncio.Future[bytes | None]) -> None:
    if not future.cancelled():
        future.exception()


def _retrieve(future: asyncio.Future[Outgoing]) -> None:
    """Mark the outcome of a preparation as seen: a failure whose last waiter gave up is
    reported to the waiters that come later, never logged as "never retrieved"."""
    if not future.cancelled():
        future.exception()


class HeaderCache:
    """Prepares each outgoing message once, off the event loop, and publishes it.

    Copying a GPU state to the host once per neighbour would waste time on big models, so
    concurrent pushes of one message share one preparation (and, through
    :attr:`Outgoing.trailer`, the checksum the first completed stream computed). Entries are keyed
    by ``(round, id(message))`` and hold the message, so an id cannot be reused while cached;
    only the newest ``keep`` rounds are kept. A message must not be mutated after its first
    push. Every prepared message is also handed to :meth:`Receiver.publish`, so neighbours can
    pull it.

    The preparation belongs to the cache, not to any one pusher: a pusher that is cancelled
    stops waiting, the others (and later retries) still get the result. :meth:`close` ends the
    preparations still running, so none outlives the transport; their waiters get
    :class:`TransportClosed`.
    """

    def __init__(self, receiver: Receiver, keep: int = 2) -> None:
        self._receiver = receiver
        self._keep = keep
        self._entries: dict[tuple[int, int], tuple[RoundMessage, asyncio.Future[Outgoing]]]
        self._entries = {}
        self._running: set[asyncio.Future[Outgoing]] = set()

    async def get(self, message: RoundMessage, publish: bool = True) -> Outgoing:
        """The prepared form of ``message`` (prepared now, or by an earlier call); ``publish``
        False: not kept for pulls (what one neighbour is sent instead of the published state,
        see :attr:`~dacflnode.transport.base.Inbox.outgoing`)."""
        key = (message.round, id(message))
        entry = self._entries.get(key)
        if entry is None or entry[0] is not message:
            future = asyncio.ensure_future(self._prepare(message, publish))
            future.add_done_callback(_retrieve)
            self._running.add(future)
            future.add_done_callback(self._running.discard)
            entry = (message, future)
            self._entries[key] = entry
            for old in [k for k in self._entries if k[0] <= message.round - self._keep]:
                del self._entries[old]
        try:
            # shielded: one pusher giving up must not cancel the work the others await
            return await asyncio.shield(entry[1])
        except asyncio.CancelledError:
            if entry[1].cancelled() and not cancelled_by_caller():
                raise TransportClosed("the transport stopped while preparing the state of "
                                      f"round {message.round}") from None
            raise
        except Exception:
            if self._entries.get(key) is entry:
                del self._entries[key]  # a later push tries again
            raise

    async def close(self) -> None:
        """Cancel the preparations still running and wait until they have ended."""
        running = list(self._running)
        self._entries.clear()
        for future in running:
            future.cancel()
        if running:
            await asyncio.gather(*running, return_exceptions=True)

    async def _prepare(self, message: RoundMessage, publish: bool = True) -> Outgoing:
        def work() -> Outgoing:
            cpu = on_cpu(message)
            return Outgoing(cpu, make_header(cpu))

        out = await asyncio.to_thread(work)
        if publish:
            self._receiver.publish(out.message, out.header)
        return out
