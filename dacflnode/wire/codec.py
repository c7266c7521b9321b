"""Round state ↔ a stream of :class:`StateChunk` messages: a header, the payload in data chunks
of ~1 MiB of raw bytes each, then a trailer with the payload's checksum.

Sending reads the tensors through ``memoryview`` slices, one chunk at a time; over gRPC each
data chunk is serialized by hand with one copy of its slice, and hashed right after that copy
while its bytes are still in the cache (:class:`SerializedStream`, the same bytes protobuf
writes); the checksum goes last, in the trailer, so no pass over the payload comes before the
first byte is sent. Receiving validates the header completely (sender, round, degree, tensor
names, dtypes, shapes and the total size) *before* it allocates anything, then writes every
chunk straight into one preallocated buffer, hashing each chunk and summing its floats as it
arrives (a data chunk received over gRPC is parsed by :func:`parse_chunk` without building a
protobuf copy of its payload), and checks size and the trailer's XXH3-128 checksum at the end:
a stream whose trailer is missing, early, repeated or wrong is refused. The checksum
guards against corruption and truncation, not tampering: anyone can compute it for a forged
payload. Only mutual TLS between neighbours (``node.tls``) guards a connection against tampering
and spoofing; without it nothing does. XXH3 runs at memory speed, so it costs a few percent of a
transfer instead of doubling it. Nothing is ever unpickled: the payload is raw little-endian
float32 bytes (or, for a compressed state, the raw little-endian bytes of its parts: float16,
bfloat16, int8, int32; see :data:`DTYPES`), and a payload that holds NaN or an infinity is
refused (:func:`check_finite`) before anyone can mix it.

Receiving a state of ``B`` bytes costs ``B`` bytes plus the chunks in flight (its buffer comes
from a :class:`BufferPool` and is reused in later rounds); sending costs three chunks.
The wire bytes are protobuf's own: a peer that serializes with protobuf reads and writes the
same streams.
"""

from __future__ import annotations

import enum
import io
import sys
import weakref
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import xxhash

from dacflnode._proto.dacfl.v1 import neighbor_pb2 as pb
from dacflnode.wire.errors import STRANGER_MESSAGE, Reason, Refusal, WireError

__all__ = [
    "CHECKSUM_BYTES", "CHUNK_BYTES", "DTYPES", "MAX_ANCHORS", "MAX_USED_LOG",
    "PROTOCOL_VERSION", "BufferPool", "Chunk", "CompressedSpec", "DataSerializer", "Decoder",
    "Expectation", "Kind", "Reason", "Refusal", "RoundMessage", "SerializedStream",
    "TensorField", "UsedLog", "WireError", "check_copy", "check_fields", "check_finite",
    "check_log", "checksum", "chunk_size", "chunks", "decode", "dtype_name", "dtype_name_of",
    "encode", "make_header", "parse_chunk", "payload_slices", "serialize_chunk",
    "serialize_data", "serialized_chunks", "trailer_chunk",
]

#: 3: the checksum travels in a trailer after the data (2 had it in the header).
PROTOCOL_VERSION = 3
#: At most this many rounds in a header's ``used_log`` (a node sends ``gone_after + 2``).
MAX_USED_LOG = 64
#: At most this many anchor rounds in a header.
MAX_ANCHORS = 16
CHUNK_BYTES = 1 << 20
CHECKSUM_BYTES = 16
#: The tensor dtypes the wire carries, by wire name: float32 for full states, the others for
#: the parts of a compressed state (docs/compression.md).
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int8": torch.int8,
    "int32": torch.int32,
}
#: The dtypes whose values can be NaN or infinite (integers are always finite).
_FLOATS = frozenset({torch.float32, torch.float16, torch.bfloat16})
_DTYPE_NAMES = {v: k for k, v in DTYPES.items()}

if sys.byteorder != "little":  # pragma: no cover - every supported platform is little-endian
    raise ImportError("the dacfl wire format is little-endian; this host is not")


class Kind(enum.IntEnum):
    """What a state is for (``StateKind`` on the wire; see docs/faults.md)."""

    STATE = pb.STATE  # a round's state, to be mixed
    LEAVING = pb.LEAVING  # the sender's last state before it leaves: read, do not mix
    HANDOVER = pb.HANDOVER  # after LEAVING: ``x`` is the sender's mass to add to ``x``
    FINAL = pb.FINAL  # after the last round: read, do not mix


#: ``(round, neighbours mixed in that round)`` for the sender's last few rounds, oldest first.
UsedLog = tuple[tuple[int, tuple[str, ...]], ...]


@dataclass(frozen=True)
class RoundMessage:
    """One node's state for one round, as neighbours exchange it.

    ``used_log`` says which neighbours' states the sender mixed in each of its last few rounds
    (how a neighbour learns that an edge was used on one end only, and undoes it); ``anchors``
    are the future rounds at which every node re-anchors (both: docs/faults.md).

    A compressed state carries the ids of the sender's public copy before (``copy_base``) and
    after (``copy_next``) applying its update; a copy-pull reply carries the pulled copy's id
    in ``copy_next``. 0: none (docs/compression.md).
    """

    sender: str
    round: int
    degree: int
    tensors: Mapping[str, torch.Tensor]
    used_log: UsedLog = ()
    kind: Kind = Kind.STATE
    anchors: tuple[int, ...] = ()
    copy_base: int = 0
    copy_next: int = 0

    @property
    def payload_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    @property
    def used(self) -> tuple[str, ...]:
        """The neighbours the sender mixed in the round before this one."""
        return self.used_in(self.round - 1) or ()

    def used_in(self, round_: int) -> tuple[str, ...] | None:
        """The neighbours the sender mixed in ``round_``; ``None`` if the log does not say."""
        for r, peers in self.used_log:
            if r == round_:
                return peers
        return None


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
        if tensor.dtype not in _DTYPE_NAMES:
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
            pb.TensorSpec(name=n, dtype=_DTYPE_NAMES[t.dtype], shape=list(t.shape))
            for n, t in message.tensors.items()
        ],
        payload_bytes=sum(v.nbytes for v in views),
        used_log=[pb.UsedRound(round=r, peers=list(p)) for r, p in message.used_log],
        kind=int(message.kind),  # type: ignore[arg-type]
        anchors=list(message.anchors),
        copy_base=message.copy_base,
        copy_next=message.copy_next,
    )


def chunks(message: RoundMessage, chunk_bytes: int = CHUNK_BYTES) -> Iterator[pb.StateChunk]:
    """The payload of ``message`` as data chunks of at most ``chunk_bytes`` (no header, no
    trailer)."""
    for part in payload_slices(message, chunk_bytes):
        yield pb.StateChunk(data=bytes(part))


def trailer_chunk(digest: bytes) -> pb.StateChunk:
    """The chunk that ends a stream: the XXH3-128 ``digest`` of its payload."""
    return pb.StateChunk(trailer=digest)


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


#: A compressed state's tensor set: part name -> (dtype, shape).
CompressedSpec = Mapping[str, tuple[torch.dtype, tuple[int, ...]]]


@dataclass
class Expectation:
    """What a receiver accepts: known senders, acceptable rounds, the exact tensor set.

    A message's tensors must be exactly the float32 set ``tensors`` or, when given, exactly the
    ``compressed`` set (names, dtypes and shapes), never a mix. ``copy_next``, when given, is
    the copy id a message must carry (a copy pull's answer).
    """

    senders: Collection[str]
    tensors: Mapping[str, tuple[int, ...]]  # name -> shape, all float32
    accept_round: Callable[[int], Refusal | None] = lambda r: None  # a refusal, or None
    max_degree: int = 1 << 16
    compressed: CompressedSpec | None = None
    copy_next: int | None = None

    def specs(self, names: Collection[str]) -> Mapping[str, tuple[torch.dtype, tuple[int, ...]]]:
        """The expected ``name -> (dtype, shape)`` set that ``names`` must match: the float32
        one, or the compressed one when ``names`` are its names; raises :class:`WireError`
        when ``names`` match neither."""
        wanted = set(names)
        if wanted == set(self.tensors):
            return {n: (torch.float32, tuple(s)) for n, s in self.tensors.items()}
        if self.compressed is not None and wanted == set(self.compressed):
            return self.compressed
        sets = f"the expected {sorted(self.tensors)}"
        if self.compressed is not None:
            sets += f" or the compressed {sorted(self.compressed)}"
        raise WireError("INVALID_ARGUMENT", f"tensors {sorted(names)} do not match {sets}",
                        Reason.BAD_PAYLOAD)


#: One tensor of a checked message: name, dtype, shape, number of elements.
TensorField = tuple[str, torch.dtype, tuple[int, ...], int]


def check_fields(
    expect: Expectation,
    round_: int,
    degree: int,
    tensors: Sequence[tuple[str, str, tuple[int, ...]]],
) -> list[TensorField]:
    """Check a message's round, degree and ``(name, dtype name, shape)`` list against
    ``expect`` (the sender is checked by the caller) and return ``(name, dtype, shape,
    numel)`` per tensor, in order; raises :class:`WireError` with the code and
    :class:`Reason` a receiver answers with. The tensors must be exactly the float32 set or
    exactly the compressed set of ``expect`` (see :class:`Expectation`).

    Shared by :class:`Decoder` (fields read from a header) and the in-memory transport's
    no-copy path (fields read from the tensors themselves), so both refuse the same messages
    in the same terms.
    """
    refused = expect.accept_round(round_)
    if refused is not None:
        raise WireError(refused.code, f"round {round_} refused: {refused.detail}",
                        refused.reason)
    if not 1 <= degree <= expect.max_degree:
        raise WireError("INVALID_ARGUMENT", f"degree {degree} out of range", Reason.BAD_HEADER)
    names = [name for name, _, _ in tensors]
    if len(set(names)) != len(names):
        raise WireError("INVALID_ARGUMENT", f"tensors {names}: a name twice",
                        Reason.BAD_PAYLOAD)
    specs = expect.specs(names)
    shapes: list[TensorField] = []
    for name, dtype, shape in tensors:
        want_dtype, want_shape = specs[name]
        if DTYPES.get(dtype) is not want_dtype:
            raise WireError("INVALID_ARGUMENT",
                            f"tensor {name}: dtype {dtype!r}, expected {dtype_name_of(want_dtype)}",
                            Reason.BAD_PAYLOAD)
        if shape != tuple(want_shape):
            raise WireError(
                "INVALID_ARGUMENT",
                f"tensor {name}: shape {list(shape)}, expected {list(want_shape)}",
                Reason.BAD_PAYLOAD,
            )
        numel = int(np.prod(shape, dtype=np.int64)) if shape else 1
        shapes.append((name, want_dtype, shape, numel))
    return shapes


def check_copy(expect: Expectation, copy_next: int) -> None:
    """Refuse a message whose ``copy_next`` is not the copy id ``expect`` asks for (a copy
    pull answered with another copy)."""
    if expect.copy_next is not None and copy_next != expect.copy_next:
        raise WireError("INVALID_ARGUMENT", f"copy {copy_next} but copy {expect.copy_next} "
                        "was asked for", Reason.BAD_HEADER)


def check_log(
    expect: Expectation, round_: int, kind: int, used_log: UsedLog, anchors: Sequence[int]
) -> None:
    """Check a message's bookkeeping fields (before anything is allocated): a known kind, at
    most :data:`MAX_USED_LOG` earlier rounds with at most ``max_degree`` names each, at most
    :data:`MAX_ANCHORS` anchor rounds, none of them in the past."""
    if kind not in Kind.__members__.values():
        raise WireError("INVALID_ARGUMENT", f"unknown state kind {kind}", Reason.BAD_HEADER)
    if len(used_log) > MAX_USED_LOG or len(anchors) > MAX_ANCHORS:
        raise WireError("INVALID_ARGUMENT", f"used_log of {len(used_log)} rounds or "
                        f"{len(anchors)} anchors: too many", Reason.BAD_HEADER)
    for r, peers in used_log:
        if r >= round_ or len(peers) > expect.max_degree:
            raise WireError("INVALID_ARGUMENT", f"used_log entry for round {r} with "
                            f"{len(peers)} names (message round {round_})", Reason.BAD_HEADER)
    if any(a <= 0 for a in anchors):
        raise WireError("INVALID_ARGUMENT", "anchor round 0", Reason.BAD_HEADER)


def check_finite(tensors: Mapping[str, torch.Tensor]) -> None:
    """Refuse a state that holds NaN or an infinity (``INVALID_ARGUMENT``,
    :attr:`~Reason.NON_FINITE`): one such value poisons every model it is mixed into, and the
    poison spreads to the whole network within a few rounds. A pass over the payload at
    memory speed: run it off the event loop for large models.

    The sum of a tensor is finite whenever all its values are (unless it overflows), and NaN or
    infinite when one of them is; so one reduction, with no mask allocated, clears an honest
    state, and only a suspicious sum pays for the exact element-wise test. float16 and
    bfloat16 tensors are summed in float32 (an honest float16 sum cannot overflow it); integer
    tensors are always finite."""
    for name, tensor in tensors.items():
        if tensor.dtype not in _FLOATS:
            continue
        if bool(torch.isfinite(tensor.sum(dtype=torch.float32))):
            continue
        if not bool(torch.isfinite(tensor).all()):
            bad = int((~torch.isfinite(tensor)).sum())
            raise WireError("INVALID_ARGUMENT",
                            f"tensor {name} holds {bad} NaN or infinite values",
                            Reason.NON_FINITE)


def dtype_name(tensor: torch.Tensor) -> str:
    """The wire name of ``tensor``'s dtype (its torch name when the wire does not carry it)."""
    return dtype_name_of(tensor.dtype)


def dtype_name_of(dtype: torch.dtype) -> str:
    """The wire name of ``dtype`` (its torch name when the wire does not carry it)."""
    return _DTYPE_NAMES.get(dtype, str(dtype))


class BufferPool:
    """Receive buffers, reused once nothing refers to them any more.

    A node receives states of the same size every round. A fresh buffer costs a page fault
    for every 4 KiB the first time it is written, which takes longer than copying the bytes
    into it; a buffer written before does not. So a receiver keeps the buffers of the states it
    received and lends one out again once the last tensor that views it is gone (its lease, a
    ``memoryview`` the tensors hold, has died). A buffer is never lent twice at once, and a
    decoder writes every byte of it before anything reads it. At most ``keep`` buffers are
    held; beyond that a free one is dropped, or, when none is free, a new one is not kept.
    """

    def __init__(self, keep: int = 4) -> None:
        self.keep = keep
        self._held: list[tuple[np.ndarray[Any, np.dtype[np.uint8]],
                               weakref.ref[memoryview] | None]] = []

    def __len__(self) -> int:
        return len(self._held)

    def _free(self, at: int) -> bool:
        lease = self._held[at][1]
        return lease is None or lease() is None

    def take(self, nbytes: int) -> torch.Tensor:
        """A uint8 tensor of ``nbytes`` bytes (contents undefined), 16-byte aligned."""
        for at, (array, _) in enumerate(self._held):
            if array.size == nbytes and self._free(at):
                return self._lend(at)
        array = _byte_array(nbytes)
        if len(self._held) >= self.keep:
            free = [at for at in range(len(self._held)) if self._free(at)]
            if not free:
                return torch.from_numpy(array)
            del self._held[free[0]]
        self._held.append((array, None))
        return self._lend(len(self._held) - 1)

    def _lend(self, at: int) -> torch.Tensor:
        array = self._held[at][0]
        lease = memoryview(array)  # type: ignore[arg-type]  # the tensors hold it
        self._held[at] = (array, weakref.ref(lease))
        return _bytes_tensor(lease, array.size)


def _byte_array(nbytes: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
    """``nbytes`` uninitialised bytes (numpy aligns them for any dtype the wire carries)."""
    return np.empty(nbytes, dtype=np.uint8)


def _bytes_tensor(buffer: memoryview, nbytes: int) -> torch.Tensor:
    if nbytes == 0:  # torch.frombuffer refuses an empty buffer
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer(buffer, dtype=torch.uint8)


def _layout(shapes: Sequence[TensorField]) -> list[tuple[int, int, int]]:
    """Where each tensor lies: ``(wire offset, buffer offset, bytes)``. On the wire the
    tensors are concatenated; in the receive buffer each starts at a multiple of its element
    size (so a tensor of any dtype views its bytes in place, whatever the order). A float32
    state needs no padding: both offsets are equal."""
    out = []
    wire = at = 0
    for _, dtype, _, numel in shapes:
        size = dtype.itemsize
        at = -(-at // size) * size
        out.append((wire, at, numel * size))
        wire += numel * size
        at += numel * size
    return out


@dataclass
class Decoder:
    """Assembles one stream: :meth:`take` every chunk (or :meth:`header` once and :meth:`feed`
    per data chunk), then :meth:`finish`.

    :meth:`feed` is :meth:`reserve` (the checks, on the caller's thread) then :meth:`write` (the
    copy into the buffer, the hash and the float sum). A caller may run the writes in a worker
    thread, one at a time and in the order of their reservations, and :meth:`finish` once the
    last one has returned.

    The receive buffer holds bytes; each tensor views its part with its own dtype. A state of
    float32 tensors lies in it exactly as on the wire and has its floats summed chunk by chunk
    as they land; a compressed state (other dtypes) may have its tensors placed a few bytes
    apart (each at a multiple of its element size, see :func:`_layout`), and has its float
    tensors checked for finiteness in :meth:`finish` (it is a fraction of a full state's size).
    """

    expect: Expectation
    #: Where the receive buffer comes from (``None``: a new one per stream).
    pool: BufferPool | None = None
    _header: pb.StateHeader | None = None
    _buffer: torch.Tensor | None = None
    #: The buffer, its bytes as an array, and its floats when every tensor is float32 (``None``
    #: otherwise: nothing is summed as it lands); :meth:`write` reads the three at once.
    _target: tuple[torch.Tensor, np.ndarray[Any, np.dtype[np.uint8]],
                   np.ndarray[Any, np.dtype[np.float32]] | None] | None = None
    #: ``(wire offset, buffer offset, bytes)`` per tensor when the buffer places them apart
    #: (:func:`_layout`); ``None`` when the buffer holds the wire bytes as they are.
    _spread: list[tuple[int, int, int]] | None = None
    _size: int = 0
    _filled: int = 0
    _summed: int = 0  # floats summed so far (each sum checks a run of written floats)
    _finite: bool = True  # every sum so far was finite
    _digest: Any = None
    _trailer: bytes | None = None  # the checksum the stream's trailer carried
    _shapes: list[TensorField] = field(default_factory=list)
    _offsets: list[int] = field(default_factory=list)  # each tensor's place in the buffer

    @property
    def received(self) -> int:
        return self._filled

    def header(self, h: pb.StateHeader) -> pb.StateHeader:
        if self._header is not None:
            raise WireError("INVALID_ARGUMENT", "a second header in one stream",
                            Reason.BAD_HEADER)
        exp = self.expect
        if h.sender not in exp.senders:
            raise WireError("PERMISSION_DENIED", STRANGER_MESSAGE, Reason.UNKNOWN_SENDER,
                            detail=f"unknown sender {h.sender!r}")
        shapes = check_fields(
            exp, int(h.round), int(h.degree),
            [(t.name, t.dtype, tuple(int(s) for s in t.shape)) for t in h.tensors],
        )
        check_log(exp, int(h.round), int(h.kind), _used_log(h), list(h.anchors))
        check_copy(exp, int(h.copy_next))
        layout = _layout(shapes)
        total = sum(size for _, _, size in layout)
        if h.payload_bytes != total:
            raise WireError(
                "INVALID_ARGUMENT", f"payload_bytes {h.payload_bytes} but tensors need {total}",
                Reason.BAD_PAYLOAD,
            )
        # every field checked: now allocate
        self._header = h
        self._shapes = shapes
        self._offsets = [at for _, at, _ in layout]
        spread = any(wire != at for wire, at, _ in layout)
        self._spread = layout if spread else None
        room = layout[-1][1] + layout[-1][2] if layout else 0
        pool = self.pool
        buffer = torch.empty(room, dtype=torch.uint8) if pool is None else pool.take(room)
        raw = buffer.numpy()
        all_float32 = all(dtype is torch.float32 for _, dtype, _, _ in shapes)
        self._buffer = buffer
        self._target = (buffer, raw, raw.view(np.float32) if all_float32 else None)
        self._size = total
        self._digest = xxhash.xxh3_128()
        return h

    def reserve(self, data: bytes | memoryview) -> int:
        """Check that ``data`` may follow what came so far (a header came, the announced size
        is not exceeded) and claim its place: returns its offset in the payload. Raises
        :class:`WireError` exactly as :meth:`feed` does."""
        if self._target is None:
            raise WireError("INVALID_ARGUMENT", "data before the header", Reason.BAD_HEADER)
        if self._trailer is not None:
            raise WireError("INVALID_ARGUMENT", "data after the trailer", Reason.BAD_PAYLOAD)
        start = self._filled
        end = start + len(data) if isinstance(data, bytes) else start + data.nbytes
        if end > self._size:
            raise WireError(
                "INVALID_ARGUMENT", f"more than the announced {self._size} bytes",
                Reason.BAD_PAYLOAD,
            )
        self._filled = end
        return start

    def write(self, offset: int, data: bytes | memoryview) -> None:
        """Copy reserved ``data`` to ``offset`` of the buffer, hash it, and sum the floats it
        completes (a sum is finite when all its terms are; see :func:`check_finite`). Copy,
        hash and sum release the GIL, so this may run in a worker thread while the event loop
        receives the next chunk."""
        held = self._target  # holds the buffer (and a pooled one's lease) until done
        if held is None:
            return  # released: the stream was refused
        _, target, floats = held
        src = np.frombuffer(data, dtype=np.uint8)
        if self._spread is None:
            dst = target[offset : offset + src.nbytes]
            np.copyto(dst, src)
            self._digest.update(dst)  # the copy just written: still in the cache
        else:
            _copy_spread(self._spread, target, offset, src)
            self._digest.update(data)
        if floats is None:
            return
        done = (offset + src.nbytes) // 4
        if done > self._summed:
            with np.errstate(over="ignore", invalid="ignore"):  # a hostile sum: no warning
                total = np.add.reduce(floats[self._summed : done])
            if not np.isfinite(total):
                self._finite = False
            self._summed = done

    def feed(self, data: bytes | memoryview) -> None:
        self.write(self.reserve(data), data)

    @property
    def summed(self) -> bool:
        """Whether every float written so far was summed, each sum finite: :meth:`finish`
        then makes no pass over the payload (cheap enough for the event loop)."""
        return (self._finite and self._buffer is not None
                and self._summed == self._buffer.numel())

    def trailer(self, digest: bytes) -> None:
        """Take the stream's trailer: it must come once, after the whole payload, and hold 16
        bytes (compared with the payload's hash in :meth:`finish`)."""
        if self._header is None:
            raise WireError("INVALID_ARGUMENT", "trailer before the header", Reason.BAD_HEADER)
        if self._trailer is not None:
            raise WireError("INVALID_ARGUMENT", "a second trailer in one stream",
                            Reason.BAD_PAYLOAD)
        if self._filled != self._size:
            raise WireError("DATA_LOSS", f"trailer after {self._filled} of {self._size} "
                            "bytes: stream truncated", Reason.TRUNCATED)
        if len(digest) != CHECKSUM_BYTES:
            raise WireError("INVALID_ARGUMENT", f"trailer of {len(digest)} bytes: the checksum "
                            "must be 16 bytes of XXH3-128", Reason.BAD_HEADER)
        self._trailer = bytes(digest)

    def release(self) -> None:
        """Drop the receive buffer of a refused stream now, not when the last reference to
        this decoder (a traceback, say) goes."""
        self._buffer = None
        self._target = None

    def take(self, chunk: Chunk) -> None:
        """Hand over one chunk of the stream, header or data."""
        if isinstance(chunk, memoryview):  # a data chunk's payload (parse_chunk)
            self.feed(chunk)
            return
        kind = chunk.WhichOneof("part")
        if kind == "header":
            self.header(chunk.header)
        elif kind == "data":
            self.feed(chunk.data)
        elif kind == "trailer":
            self.trailer(chunk.trailer)
        else:
            raise WireError("INVALID_ARGUMENT", "empty chunk", Reason.BAD_HEADER)

    def finish(self) -> RoundMessage:
        """The assembled message, once size, trailer, checksum and finiteness check out (call
        it after the last :meth:`write` has returned). Finiteness was summed chunk by chunk;
        only a suspicious sum costs a pass over the payload here (off the event loop, then)."""
        if self._header is None or self._buffer is None:
            raise WireError("INVALID_ARGUMENT", "stream ended without a header",
                            Reason.BAD_HEADER)
        if self._filled != self._size:
            raise WireError(
                "DATA_LOSS", f"stream truncated: {self._filled} of {self._size} bytes",
                Reason.TRUNCATED,
            )
        if self._trailer is None:
            raise WireError("DATA_LOSS", "stream truncated: it ended without its checksum "
                            "trailer", Reason.TRUNCATED)
        if self._digest.digest() != self._trailer:
            raise WireError("DATA_LOSS", "checksum mismatch: payload corrupted in transit",
                            Reason.CHECKSUM)
        tensors: dict[str, torch.Tensor] = {}
        buffer = self._buffer
        for (name, dtype, shape, numel), at in zip(self._shapes, self._offsets, strict=True):
            size = numel * dtype.itemsize
            tensors[name] = buffer[at : at + size].view(dtype).view(shape)
        target = self._target
        if (target is None or target[2] is None or not self._finite
                or 4 * self._summed != self._size):
            check_finite(tensors)
        h = self._header
        return RoundMessage(h.sender, int(h.round), int(h.degree), tensors, _used_log(h),
                            Kind(int(h.kind)), tuple(int(a) for a in h.anchors),
                            int(h.copy_base), int(h.copy_next))


def _copy_spread(layout: Sequence[tuple[int, int, int]],
                 target: np.ndarray[Any, np.dtype[np.uint8]], offset: int,
                 src: np.ndarray[Any, np.dtype[np.uint8]]) -> None:
    """Copy the wire bytes ``src`` (from ``offset`` of the payload) to their tensors' places
    in ``target`` (``layout`` as :func:`_layout` makes it)."""
    end = offset + src.nbytes
    for wire, at, size in layout:
        lo, hi = max(offset, wire), min(end, wire + size)
        if lo < hi:
            np.copyto(target[at + lo - wire : at + hi - wire], src[lo - offset : hi - offset])


def _used_log(h: pb.StateHeader) -> UsedLog:
    return tuple((int(u.round), tuple(u.peers)) for u in h.used_log)


def decode(chunks: Iterator[Chunk], expect: Expectation) -> RoundMessage:
    """Assemble a whole stream (synchronous helper, used by tests and the in-memory transport)."""
    decoder = Decoder(expect)
    for chunk in chunks:
        decoder.take(chunk)
    return decoder.finish()
