"""A received stream of chunks assembled into a :class:`~dacflnode.wire.message.RoundMessage`
(:class:`Decoder`): the header validated completely before anything is allocated, then every
chunk written straight into one preallocated buffer, hashed and summed as it lands, and size,
trailer checksum and finiteness checked at the end. Receiving a state of ``B`` bytes costs ``B``
bytes plus the chunks in flight.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import xxhash

from dacflnode._proto.dacfl.v1 import neighbor_pb2 as pb
from dacflnode.wire.buffers import BufferPool
from dacflnode.wire.errors import STRANGER_MESSAGE, Reason, WireError
from dacflnode.wire.fast_path import Chunk
from dacflnode.wire.message import CHECKSUM_BYTES, Kind, RoundMessage, UsedLog
from dacflnode.wire.validation import (
    Expectation,
    TensorField,
    check_copy,
    check_fields,
    check_finite,
    check_log,
)


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
        completes (a sum is finite when all its terms are; see
        :func:`~dacflnode.wire.validation.check_finite`). Copy, hash and sum release the GIL, so
        this may run in a worker thread while the event loop receives the next chunk."""
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
        part = chunk.WhichOneof("part")
        if part == "header":
            self.header(chunk.header)
        elif part == "data":
            self.feed(chunk.data)
        elif part == "trailer":
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
                            int(h.copy_base), int(h.copy_next), int(h.exchange_id),
                            float(h.weight))


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
