"""The hand-written protobuf of a data chunk: the bytes ``StateChunk(data=...)`` serializes to,
written with one copy of the payload (:func:`serialize_data`, :class:`DataSerializer`), and read
back as a view of the received bytes (:func:`parse_chunk`). Every other chunk goes through
protobuf itself; the bytes are protobuf's own either way.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np

from dacflnode._proto.dacfl.v1 import neighbor_pb2 as pb

#: The first byte of a serialized data chunk: protobuf's key of ``StateChunk.data`` (field 2,
#: length-delimited), followed by the payload length as a varint and the payload.
_DATA_KEY = 0x12
#: A varint of more bytes than this cannot be the length of a message under gRPC's limits.
_MAX_VARINT = 5


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _data_key(size: int) -> bytes:
    return bytes((_DATA_KEY,)) + _varint(size)


def serialize_data(view: memoryview) -> bytes:
    """``StateChunk(data=view).SerializeToString()``, byte for byte, made with one copy of
    ``view`` (protobuf would copy it into the message, then again into the serialized
    bytes)."""
    return b"".join((_data_key(view.nbytes), view))


class DataSerializer:
    """:func:`serialize_data` into a few reused buffers, for one stream of chunks (and, given
    a ``digest``, hashed as it is written).

    Each chunk is written into the buffer of an ``io.BytesIO`` and handed out as its value,
    which CPython returns without a copy; once the caller (and gRPC, which copies a message as
    it sends it) has dropped that value, the next chunk but ``slots - 1`` is written into the
    same memory. So the chunks cost one copy each into memory that stays in the cache and is
    never faulted in again. ``BytesIO`` keeps its values immutable: while a value is still
    referenced its buffer is copied before it is written, so a caller that keeps chunks only
    makes it slower.
    """

    def __init__(self, slots: int = 2) -> None:
        self._slots: list[tuple[io.BytesIO, int] | None] = [None] * slots
        self._next = 0

    def __call__(self, view: memoryview, digest: Any = None) -> bytes:
        """``view`` serialized; ``digest`` (an ``xxh3_128``), if given, is updated with
        ``view``'s bytes from the copy just written, while they are in the cache."""
        key = _data_key(view.nbytes)
        size = len(key) + view.nbytes
        at = self._next
        self._next = (at + 1) % len(self._slots)
        slot = self._slots[at]
        if slot is None or slot[1] != size:
            slot = self._slots[at] = (io.BytesIO(bytes(size)), size)
        buffer = slot[0].getbuffer()
        try:
            out = np.frombuffer(buffer, dtype=np.uint8)
            out[: len(key)] = np.frombuffer(key, dtype=np.uint8)
            payload = out[len(key) :]
            np.copyto(payload, np.frombuffer(view, dtype=np.uint8))
            if digest is not None:
                digest.update(payload)
            del out, payload
        finally:
            buffer.release()
        return slot[0].getvalue()



#: A chunk as received: a message, or (from :func:`parse_chunk`) the payload of a data chunk.
Chunk = pb.StateChunk | memoryview


def parse_chunk(raw: bytes) -> Chunk:
    """``StateChunk.FromString(raw)``, except that a data chunk (``raw`` holds the field
    ``data`` and nothing else, as every sender writes it) comes back as a ``memoryview`` of its
    payload inside ``raw``: no protobuf message, no copy. Anything else, header, trailer or
    malformed, is parsed by protobuf itself, so its errors and its meaning are protobuf's."""
    end = len(raw)
    if end >= 2 and raw[0] == _DATA_KEY:
        size = shift = 0
        for at in range(1, min(end, 1 + _MAX_VARINT)):
            byte = raw[at]
            size |= (byte & 0x7F) << shift
            if byte < 0x80:
                if at + 1 + size == end:
                    return memoryview(raw)[at + 1 :]
                break
            shift += 7
    return pb.StateChunk.FromString(raw)


def serialize_chunk(chunk: pb.StateChunk | bytes) -> bytes:
    """The serialized form of ``chunk``; bytes (already serialized) pass unchanged."""
    return chunk if isinstance(chunk, bytes) else chunk.SerializeToString()


def chunk_size(chunk: Chunk) -> int:
    """The payload bytes a chunk carries (0 for a header)."""
    return chunk.nbytes if isinstance(chunk, memoryview) else len(chunk.data)

