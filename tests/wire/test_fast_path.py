"""The copy-saving path of the codec: hand-made chunk serialization, parsing without a protobuf
copy, chunk-by-chunk finiteness sums and the receive-buffer pool give exactly what protobuf and
the plain decoder give."""

import gc
import math

import pytest
import torch
from google.protobuf.message import DecodeError

from dacflnode._proto.dacfl.v1 import neighbor_pb2 as pb
from dacflnode.wire.buffers import BufferPool
from dacflnode.wire.decoder import Decoder, decode
from dacflnode.wire.encoder import (
    SerializedStream,
    checksum,
    encode,
    make_header,
    payload_slices,
    serialized_chunks,
)
from dacflnode.wire.errors import Reason, WireError
from dacflnode.wire.fast_path import DataSerializer, parse_chunk, serialize_data
from dacflnode.wire.message import CHUNK_BYTES, RoundMessage
from dacflnode.wire.validation import Expectation

P = 300_000  # 2 x 1.2 MB: several full chunks and a short one per tensor


def message(round_: int = 1, p: int = P, seed: int = 0) -> RoundMessage:
    g = torch.Generator().manual_seed(seed + round_)
    return RoundMessage("b", round_, 2, {"omega": torch.randn(p, generator=g),
                                         "x": torch.randn(p, generator=g)})


def expect(p: int = P) -> Expectation:
    return Expectation(senders={"b"}, tensors={"omega": (p,), "x": (p,)})


def wire_bytes(msg: RoundMessage, chunk_bytes: int = CHUNK_BYTES) -> list[bytes]:
    """The stream as a sender writes it: the header message, hand-serialized chunks, then the
    trailer."""
    header = pb.StateChunk(header=make_header(msg)).SerializeToString()
    return [header, *(bytes(c) for c in serialized_chunks(msg, chunk_bytes))]


def same_bytes(a: RoundMessage, b: RoundMessage) -> bool:
    return all(a.tensors[n].numpy().tobytes() == b.tensors[n].numpy().tobytes()
               for n in b.tensors)


@pytest.mark.parametrize("size", [0, 1, 127, 128, 16_383, 16_384, 1_000_003, CHUNK_BYTES])
def test_a_hand_serialized_data_chunk_is_the_protobuf_serialization(size):
    data = bytes(range(256)) * (size // 256) + bytes(size % 256)
    expected = pb.StateChunk(data=data).SerializeToString()
    assert serialize_data(memoryview(data)) == expected
    assert DataSerializer()(memoryview(data)) == expected


def test_the_serializer_reuses_its_buffers_yet_values_handed_out_never_change():
    serialize = DataSerializer(slots=2)
    parts = [bytes([i]) * 70_000 for i in range(6)]
    kept = [serialize(memoryview(p)) for p in parts]  # all still referenced
    for part, value in zip(parts, kept, strict=True):
        assert value == pb.StateChunk(data=part).SerializeToString()


def test_a_stream_given_its_checksum_sends_the_same_bytes_without_hashing(monkeypatch):
    msg = message()
    first = SerializedStream(msg)
    sent = list(first)
    assert first.digest == checksum(list(payload_slices(msg)))
    assert first.next_chunk() is None and first.sent == msg.payload_bytes

    def no_hashing(*args: object) -> None:
        raise AssertionError("hashed although the checksum was given")

    monkeypatch.setattr("dacflnode.wire.encoder.xxhash.xxh3_128", no_hashing)
    again = SerializedStream(msg, digest=first.digest)
    assert list(again) == sent


def test_every_stream_serializes_as_protobuf_would():
    msg = message()
    stream = [c.SerializeToString() for c in encode(msg, header=make_header(msg))]
    assert wire_bytes(msg) == stream


@pytest.mark.parametrize("raw", [
    b"",  # no part: an empty chunk
    b"\x12\x00",  # an empty data field
    b"\x12\x81\x00" + b"x",  # a non-minimal length varint
    b"\x12\x01a\x12\x01b",  # the field twice: protobuf keeps the last
    b"\x12\x01a\x18\x05",  # an unknown field after the data
    b"\x18\x05\x12\x01a",  # an unknown field before the data
    b"\x0a\x00",  # an empty header
    b"\x12\x01a\x0a\x02\x08\x01",  # data, then a header: the oneof keeps the header
    b"\x12\x80\x80\x80\x80\x00",  # a five-byte varint of zero
])
def test_parse_chunk_means_what_protobuf_means(raw):
    parsed = parse_chunk(raw)
    reference = pb.StateChunk.FromString(raw)
    if isinstance(parsed, memoryview):
        assert reference.WhichOneof("part") == "data"
        assert parsed.tobytes() == reference.data
    else:
        assert parsed == reference


@pytest.mark.parametrize("raw", [
    b"\x12\x05abc",  # shorter than its length
    b"\x12",  # a key and nothing else
    b"\x12\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",  # a length varint too long
    b"\x0a\x03\x08",  # a header cut short
    b"\xff\xff\xff",  # not protobuf
])
def test_a_malformed_chunk_fails_as_protobuf_fails(raw):
    with pytest.raises(DecodeError):
        pb.StateChunk.FromString(raw)
    with pytest.raises(DecodeError):
        parse_chunk(raw)


def test_a_parsed_data_chunk_is_a_view_of_the_received_bytes_not_a_copy():
    raw = pb.StateChunk(data=b"\x07" * 1000).SerializeToString()
    parsed = parse_chunk(raw)
    assert isinstance(parsed, memoryview)
    assert parsed.obj is raw and parsed.nbytes == 1000


@pytest.mark.parametrize("chunk_bytes", [CHUNK_BYTES, 65_536, 1000, 7])
def test_decoding_parsed_chunks_is_bit_exact(chunk_bytes):
    p = P if chunk_bytes >= 65_536 else 5000
    msg = message(p=p)
    out = decode((parse_chunk(raw) for raw in wire_bytes(msg, chunk_bytes)), expect(p))
    assert same_bytes(out, msg)
    assert (out.sender, out.round, out.degree) == ("b", 1, 2)


def test_a_stream_fed_in_odd_pieces_is_bit_exact():
    msg = message(p=5000)
    payload = b"".join(t.numpy().tobytes() for t in msg.tensors.values())
    decoder = Decoder(expect(5000))
    decoder.header(make_header(msg))
    at = 0
    for size in [1, 2, 3, 5, 4093, 3, 7]:
        decoder.feed(memoryview(payload)[at : at + size])
        at += size
    decoder.feed(payload[at:])
    decoder.trailer(checksum([memoryview(payload)]))
    assert same_bytes(decoder.finish(), msg)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("where", [0, 1, P - 1, P + 262_143, 2 * P - 1])
def test_a_non_finite_value_is_refused_wherever_the_chunks_cut(bad, where):
    msg = message()
    flat = torch.cat([msg.tensors["omega"], msg.tensors["x"]])
    flat[where] = bad
    msg = RoundMessage("b", 1, 2, {"omega": flat[:P].clone(), "x": flat[P:].clone()})
    for chunk_bytes in (CHUNK_BYTES, 1_000_001):
        with pytest.raises(WireError, match="NaN or infinite") as err:
            decode((parse_chunk(raw) for raw in wire_bytes(msg, chunk_bytes)), expect())
        assert (err.value.code, err.value.reason) == ("INVALID_ARGUMENT", Reason.NON_FINITE)


def test_finite_values_whose_chunk_sum_overflows_are_accepted():
    big = torch.full((P,), 3.0e38)
    msg = RoundMessage("b", 1, 2, {"omega": big, "x": -big})
    out = decode((parse_chunk(raw) for raw in wire_bytes(msg)), expect())
    assert same_bytes(out, msg)


def test_a_corrupted_chunk_still_fails_the_checksum():
    msg = message()
    stream = wire_bytes(msg)
    middle = bytearray(stream[2])
    middle[len(middle) // 2] ^= 0x10
    stream[2] = bytes(middle)
    with pytest.raises(WireError) as err:
        decode((parse_chunk(raw) for raw in stream), expect())
    assert (err.value.code, err.value.reason) == ("DATA_LOSS", Reason.CHECKSUM)


def test_the_pool_lends_a_buffer_again_only_once_no_tensor_views_it():
    pool = BufferPool(keep=4)
    first = decode_with(pool, message(1))
    first_ptr = first.tensors["omega"].data_ptr()
    second = decode_with(pool, message(2))
    assert second.tensors["omega"].data_ptr() != first_ptr  # the first is still in use
    x_of_first = first.tensors["x"]  # a view keeps the whole buffer in use
    del first
    gc.collect()
    third = decode_with(pool, message(3))
    assert third.tensors["omega"].data_ptr() not in (first_ptr,
                                                      second.tensors["omega"].data_ptr())
    assert torch.equal(x_of_first, message(1).tensors["x"])
    del x_of_first, third
    gc.collect()
    fourth = decode_with(pool, message(4))
    assert fourth.tensors["omega"].data_ptr() == first_ptr  # the oldest free one
    assert len(pool) == 3
    assert same_bytes(fourth, message(4)) and same_bytes(second, message(2))


def test_a_reused_buffer_holds_only_the_new_state():
    pool = BufferPool(keep=1)
    first = decode_with(pool, message(1))
    ptr = first.tensors["omega"].data_ptr()
    del first
    gc.collect()
    again = decode_with(pool, message(2, seed=5))
    assert again.tensors["omega"].data_ptr() == ptr
    assert same_bytes(again, message(2, seed=5))


def test_a_full_pool_of_buffers_in_use_hands_out_buffers_it_does_not_keep():
    pool = BufferPool(keep=1)
    held = [decode_with(pool, message(r)) for r in (1, 2, 3)]
    assert len(pool) == 1
    assert len({m.tensors["x"].data_ptr() for m in held}) == 3
    assert all(same_bytes(m, message(r)) for m, r in zip(held, (1, 2, 3), strict=True))


def test_a_refused_stream_gives_its_buffer_back_to_the_pool():
    pool = BufferPool(keep=1)
    msg = message()
    stream = wire_bytes(msg)
    decoder = Decoder(expect(), pool=pool)
    with pytest.raises(WireError):
        for raw in [*stream, stream[1]]:  # one chunk too many
            decoder.take(parse_chunk(raw))
    decoder.release()
    del decoder
    gc.collect()
    assert same_bytes(decode_with(pool, msg), msg)
    assert len(pool) == 1


def decode_with(pool: BufferPool, msg: RoundMessage) -> RoundMessage:
    decoder = Decoder(expect(), pool=pool)
    for raw in wire_bytes(msg):
        decoder.take(parse_chunk(raw))
    return decoder.finish()
