"""A :class:`~dacflnode.wire.message.RoundMessage` as a stream of chunks: its header, its payload
in data chunks read through ``memoryview`` slices of its tensors, then the trailer with the
payload's XXH3-128 checksum (hashed as the chunks are made, so no pass over the payload comes
before the first byte is sent). Sending costs three chunks.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from typing import Any

import torch
import xxhash

from dacflnode._proto.dacfl.v1 import neighbor_pb2 as pb
from dacflnode.wire.fast_path import DataSerializer
from dacflnode.wire.message import CHUNK_BYTES, DTYPE_NAMES, RoundMessage


def _byte_view(tensor: torch.Tensor) -> memoryview:
    flat = tensor.detach().reshape(-1)
    if flat.device.type != "cpu":
        flat = flat.cpu()
    if not flat.is_contiguous():
        flat = flat.contiguous()
    if flat.dtype is torch.bfloat16:  # numpy has no bfloat16: the same bytes as int16
        flat = flat.view(torch.int16)
    return memoryview(flat.numpy()).cast("B")  # type: ignore[arg-type]


def checksum(views: Collection[memoryview]) -> bytes:
    """XXH3-128 of the concatenated views."""
    digest = xxhash.xxh3_128()
    for view in views:
        digest.update(view)
    return digest.digest()


def _views(message: RoundMessage) -> list[memoryview]:
    for name, tensor in message.tensors.items():
        if tensor.dtype not in DTYPE_NAMES:
            raise ValueError(f"tensor {name} has unsupported dtype {tensor.dtype}")
    return [_byte_view(t) for t in message.tensors.values()]


def make_header(message: RoundMessage) -> pb.StateHeader:
    """The header of ``message`` (no pass over the payload: its checksum is the trailer's)."""
    views = _views(message)
    return pb.StateHeader(
        sender=message.sender,
        round=message.round,
        degree=message.degree,
        tensors=[
            pb.TensorSpec(name=n, dtype=DTYPE_NAMES[t.dtype], shape=list(t.shape))
            for n, t in message.tensors.items()
        ],
        payload_bytes=sum(v.nbytes for v in views),
        used_log=[pb.UsedRound(round=r, peers=list(p)) for r, p in message.used_log],
        kind=int(message.kind),  # type: ignore[arg-type]
        anchors=list(message.anchors),
        copy_base=message.copy_base,
        copy_next=message.copy_next,
        exchange_id=message.exchange_id,
        weight=message.weight,
    )


def chunks(message: RoundMessage, chunk_bytes: int = CHUNK_BYTES) -> Iterator[pb.StateChunk]:
    """The payload of ``message`` as data chunks of at most ``chunk_bytes`` (no header, no
    trailer)."""
    for part in payload_slices(message, chunk_bytes):
        yield pb.StateChunk(data=bytes(part))


def trailer_chunk(digest: bytes) -> pb.StateChunk:
    """The chunk that ends a stream: the XXH3-128 ``digest`` of its payload."""
    return pb.StateChunk(trailer=digest)



def payload_slices(message: RoundMessage, chunk_bytes: int = CHUNK_BYTES) -> Iterator[memoryview]:
    """The payload of ``message`` as views of at most ``chunk_bytes`` (what each data chunk
    carries), without a copy."""
    for view in _views(message):
        for start in range(0, view.nbytes, chunk_bytes):
            yield view[start : start + chunk_bytes]


class SerializedStream:
    """The data chunks of ``message`` as gRPC sends them, each hashed as it is serialized, then
    the trailer: what follows the header of a stream.

    :meth:`next_chunk` makes one chunk per call (``None`` after the trailer), so a caller may
    make the next chunk in a worker thread while the current one is sent (copy and hash
    release the GIL), one call at a time. With ``digest`` given (the checksum of this very
    payload, from an earlier stream of it) nothing is hashed. Chunks come from a
    :class:`DataSerializer` of three slots: drop each chunk before asking for the next one but
    two.
    """

    def __init__(self, message: RoundMessage, chunk_bytes: int = CHUNK_BYTES,
                 digest: bytes | None = None) -> None:
        self._parts = payload_slices(message, chunk_bytes)
        self._serialize = DataSerializer(slots=3)
        self._hash: Any = xxhash.xxh3_128() if digest is None else None
        self.digest = digest
        #: Payload bytes in the chunks made so far.
        self.sent = 0
        self._done = False

    def next_chunk(self) -> bytes | None:
        """The next serialized chunk: data, then the trailer; ``None`` once the trailer was
        made (then :attr:`digest` is the payload's checksum)."""
        part = next(self._parts, None)
        if part is not None:
            data = self._serialize(part, self._hash)
            self.sent += part.nbytes
            return data
        if self._done:
            return None
        self._done = True
        if self.digest is None:
            self.digest = self._hash.digest()
        return trailer_chunk(self.digest).SerializeToString()

    def __iter__(self) -> Iterator[bytes]:
        while (data := self.next_chunk()) is not None:
            yield data
            del data  # the serializer reuses the buffer once nothing holds it


def serialized_chunks(message: RoundMessage, chunk_bytes: int = CHUNK_BYTES) -> Iterator[bytes]:
    """:func:`chunks` and the trailer, serialized: what gRPC sends after the header of
    ``message`` (see :class:`SerializedStream`)."""
    return iter(SerializedStream(message, chunk_bytes))



def encode(
    message: RoundMessage,
    chunk_bytes: int = CHUNK_BYTES,
    header: pb.StateHeader | None = None,
) -> Iterator[pb.StateChunk]:
    """Yield the header (made unless given), the payload in chunks, then the trailer (the
    payload hashed chunk by chunk as it is yielded)."""
    yield pb.StateChunk(header=header if header is not None else make_header(message))
    digest = xxhash.xxh3_128()
    for part in payload_slices(message, chunk_bytes):
        data = bytes(part)
        digest.update(data)
        yield pb.StateChunk(data=data)
    yield trailer_chunk(digest.digest())
