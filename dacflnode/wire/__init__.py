"""The wire format: round state ↔ a stream of ``StateChunk`` messages: a header, the payload in
data chunks of ~1 MiB of raw bytes each, then a trailer with the payload's checksum.

Sending reads the tensors through ``memoryview`` slices, one chunk at a time; over gRPC each
data chunk is serialized by hand with one copy of its slice, and hashed right after that copy
while its bytes are still in the cache (:class:`~dacflnode.wire.encoder.SerializedStream`, the
same bytes protobuf writes); the checksum goes last, in the trailer, so no pass over the payload
comes before the first byte is sent. Receiving validates the header completely (sender, round,
degree, tensor names, dtypes, shapes and the total size) *before* it allocates anything, then
writes every chunk straight into one preallocated buffer, hashing each chunk and summing its
floats as it arrives (a data chunk received over gRPC is parsed by
:func:`~dacflnode.wire.fast_path.parse_chunk` without building a protobuf copy of its payload),
and checks size and the trailer's XXH3-128 checksum at the end: a stream whose trailer is
missing, early, repeated or wrong is refused. The checksum guards against corruption and
truncation, not tampering: anyone can compute it for a forged payload. Only mutual TLS between
neighbours (``node.tls``) guards a connection against tampering and spoofing; without it nothing
does. XXH3 runs at memory speed, so it costs a few percent of a transfer instead of doubling it.
Nothing is ever unpickled: the payload is raw little-endian float32 bytes (or, for a compressed
state, the raw little-endian bytes of its parts: float16, bfloat16, int8, int32; see
:data:`~dacflnode.wire.message.DTYPES`), and a payload that holds NaN or an infinity is refused
(:func:`~dacflnode.wire.validation.check_finite`) before anyone can mix it.

Receiving a state of ``B`` bytes costs ``B`` bytes plus the chunks in flight (its buffer comes
from a :class:`~dacflnode.wire.buffers.BufferPool` and is reused in later rounds); sending costs
three chunks. The wire bytes are protobuf's own: a peer that serializes with protobuf reads and
writes the same streams.

The modules, by concern: :mod:`~dacflnode.wire.message` (the message and the format's
constants), :mod:`~dacflnode.wire.encoder` (message → chunks), :mod:`~dacflnode.wire.fast_path`
(the hand-written protobuf of a data chunk), :mod:`~dacflnode.wire.validation` (what a receiver
accepts, checked before it allocates), :mod:`~dacflnode.wire.buffers` (receive buffers reused
across rounds), :mod:`~dacflnode.wire.decoder` (chunks → message), :mod:`~dacflnode.wire.errors`
(refusals both sides agree on) and :mod:`~dacflnode.wire.state_guard` (states refused for their
values).
"""
