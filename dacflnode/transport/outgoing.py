"""Outgoing states, shared by both transports: prepared once per message, streamed per neighbour.

A node pushes the same :class:`~dacflnode.wire.codec.RoundMessage` to all its neighbours,
concurrently. :class:`HeaderCache` prepares it once (host copy, contiguous tensors, header with
the payload checksum) off the event loop, and :class:`ChunkStream` streams the prepared state to
one neighbour, counting what it handed out. See docs/wire-format.md for the stream layout.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Iterator
from dataclasses import dataclass, replace

from dacflnode._proto.dacfl.v1 import neighbor_pb2 as pb
from dacflnode.transport.base import TransportClosed, cancelled_by_caller
from dacflnode.transport.receiver import Receiver
from dacflnode.wire.codec import (
    DataSerializer,
    RoundMessage,
    chunks,
    make_header,
    payload_slices,
    serialize_chunk,
)


@dataclass(frozen=True)
class Outgoing:
    """A message ready to stream: its tensors in contiguous CPU memory, and its header."""

    message: RoundMessage
    header: pb.StateHeader

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
    """One neighbour's copy of the stream of a prepared message: the header, then the payload.

    :attr:`sent` counts the payload bytes handed out so far, so a push that fails half-way
    still accounts for what it sent.
    """

    def __init__(self, out: Outgoing) -> None:
        self.out = out
        self.sent = 0

    def __iter__(self) -> Iterator[pb.StateChunk]:
        yield pb.StateChunk(header=self.out.header)
        for chunk in chunks(self.out.message):
            self.sent += len(chunk.data)
            yield chunk

    def serialized(self) -> Iterator[bytes]:
        """The same stream, serialized as gRPC sends it: the header made once per message,
        then each data chunk made with one copy of its slice of the tensors."""
        yield self.out.header_bytes
        serialize = DataSerializer()
        for part in payload_slices(self.out.message):
            data = serialize(part)
            self.sent += part.nbytes
            yield data
            del data  # the serializer reuses the buffer once nothing holds it


def _retrieve(future: asyncio.Future[Outgoing]) -> None:
    """Mark the outcome of a preparation as seen: a failure whose last waiter gave up is
    reported to the waiters that come later, never logged as "never retrieved"."""
    if not future.cancelled():
        future.exception()


class HeaderCache:
    """Prepares each outgoing message once, off the event loop, and publishes it.

    Copying a GPU state to the host and hashing the payload once per neighbour would waste time
    on big models, so concurrent pushes of one message share one preparation. Entries are keyed
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
