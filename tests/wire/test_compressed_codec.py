"""Compressed states on the wire: parts of several dtypes, copy ids, and their validation
before anything is allocated."""

from __future__ import annotations

import itertools

import pytest
import torch

from dacflnode._proto.dacfl.v1 import neighbor_pb2 as pb
from dacflnode.transport.receiver import check_message
from dacflnode.wire.buffers import BufferPool
from dacflnode.wire.decoder import Decoder, decode
from dacflnode.wire.encoder import encode, serialized_chunks
from dacflnode.wire.errors import Reason, WireError
from dacflnode.wire.fast_path import parse_chunk
from dacflnode.wire.message import RoundMessage
from dacflnode.wire.validation import Expectation, check_finite

P = 1001  # odd: no part's bytes end on a word boundary
FULL = {"omega": (P,), "x": (P,)}
#: Parts of every dtype, in an order that puts an odd-sized int8 part before wider ones.
COMPRESSED: dict[str, tuple[torch.dtype, tuple[int, ...]]] = {
    "x.q": (torch.int8, (P,)),
    "x.scale": (torch.float32, (2,)),
    "omega.values": (torch.bfloat16, (11,)),
    "omega.indices": (torch.int32, (11,)),
    "omega.half": (torch.float16, (3, 5)),
}


def compressed(seed: int = 0, sender: str = "b") -> RoundMessage:
    g = torch.Generator().manual_seed(seed)
    tensors = {
        "x.q": torch.randint(-128, 128, (P,), generator=g, dtype=torch.int8),
        "x.scale": torch.rand(2, generator=g),
        "omega.values": torch.randn(11, generator=g).to(torch.bfloat16),
        "omega.indices": torch.randint(-(2**31), 2**31 - 1, (11,), generator=g,
                                       dtype=torch.int32),
        "omega.half": torch.randn(3, 5, generator=g).to(torch.float16),
    }
    # extremes whose bits a lossy path would change
    tensors["x.q"][:2] = torch.tensor([-128, 127], dtype=torch.int8)
    tensors["omega.values"][0] = torch.finfo(torch.bfloat16).max
    tensors["omega.half"][0, :2] = torch.tensor([65504.0, -6e-8], dtype=torch.float16)
    return RoundMessage(sender, 3, 2, tensors, copy_base=2**64 - 1, copy_next=7)


def expect(compressed_set: dict[str, tuple[torch.dtype, tuple[int, ...]]] | None = COMPRESSED,
           copy_next: int | None = None) -> Expectation:
    return Expectation(senders={"b"}, tensors=FULL, compressed=compressed_set,
                       copy_next=copy_next)


def raw_bytes(tensor: torch.Tensor) -> bytes:
    return bytes(tensor.contiguous().view(-1).view(torch.uint8).numpy())


def assert_bit_exact(got: RoundMessage, sent: RoundMessage) -> None:
    assert (got.sender, got.round, got.copy_base, got.copy_next) == (
        sent.sender, sent.round, sent.copy_base, sent.copy_next)
    assert list(got.tensors) == list(sent.tensors)
    for name, tensor in sent.tensors.items():
        out = got.tensors[name]
        assert (out.dtype, out.shape) == (tensor.dtype, tensor.shape), name
        assert raw_bytes(out) == raw_bytes(tensor), name
        assert out.data_ptr() % out.element_size() == 0, name  # aligned, whatever the order


@pytest.mark.parametrize("chunk_bytes", [1, 7, 1000, 1 << 20])
def test_a_compressed_state_round_trips_bit_exact_with_its_copy_ids(chunk_bytes):
    msg = compressed()
    assert_bit_exact(decode(encode(msg, chunk_bytes=chunk_bytes), expect()), msg)


def test_any_order_of_parts_round_trips_through_a_pooled_buffer():
    pool = BufferPool(keep=2)
    msg = compressed()
    for order in itertools.islice(itertools.permutations(msg.tensors), 0, None, 17):
        reordered = RoundMessage("b", 3, 2, {n: msg.tensors[n] for n in order},
                                 copy_base=1, copy_next=2)
        decoder = Decoder(expect(), pool=pool)
        for raw in [encode(reordered).__next__().SerializeToString(),
                    *serialized_chunks(reordered, 100)]:
            decoder.take(parse_chunk(raw))
        assert_bit_exact(decoder.finish(), reordered)
    assert len(pool) <= 2


def test_the_payload_is_the_plain_concatenation_of_the_parts():
    msg = compressed()
    data = b"".join(c.data for c in list(encode(msg, chunk_bytes=13))[1:])
    assert data == b"".join(raw_bytes(t) for t in msg.tensors.values())
    assert len(data) == msg.payload_bytes == P + 8 + 22 + 44 + 30


def test_a_full_float32_state_is_still_accepted_when_a_compressed_set_is_expected():
    g = torch.Generator().manual_seed(1)
    full = RoundMessage("b", 3, 2, {"omega": torch.randn(P, generator=g),
                                     "x": torch.randn(P, generator=g)}, copy_next=9)
    assert_bit_exact(decode(encode(full, chunk_bytes=333), expect()), full)


def refusal(stream: list[pb.StateChunk], expectation: Expectation,
            pool: BufferPool | None = None) -> WireError:
    decoder = Decoder(expectation, pool=pool)
    with pytest.raises(WireError) as err:
        for chunk in stream:
            decoder.take(chunk)
        decoder.finish()
    return err.value


def tampered(change) -> list[pb.StateChunk]:
    stream = list(encode(compressed(), chunk_bytes=256))
    change(stream[0].header)
    return stream


def spec(h: pb.StateHeader, name: str) -> pb.TensorSpec:
    return next(t for t in h.tensors if t.name == name)


@pytest.mark.parametrize(
    ("change", "text"),
    [
        (lambda h: setattr(spec(h, "x.q"), "dtype", "float32"), "dtype 'float32', expected int8"),
        (lambda h: setattr(spec(h, "omega.values"), "dtype", "float16"), "expected bfloat16"),
        (lambda h: setattr(spec(h, "omega.indices"), "dtype", "int64"), "dtype 'int64'"),
        (lambda h: spec(h, "x.q").shape.__setitem__(0, P + 1), "shape"),
        (lambda h: spec(h, "omega.half").shape.__setitem__(1, 3), "shape"),
        (lambda h: setattr(spec(h, "x.q"), "name", "x"), "do not match"),  # full and parts
        (lambda h: setattr(spec(h, "x.scale"), "name", "x.q"), "a name twice"),
        (lambda h: setattr(h, "payload_bytes", 4 * (P + 2 + 11 + 11 + 15)), "payload_bytes"),
        (lambda h: setattr(h, "payload_bytes", h.payload_bytes + 1), "payload_bytes"),
    ],
    ids=["int8-as-float32", "bf16-as-fp16", "int32-as-int64", "shape", "shape-2d",
         "mixed-sets", "duplicate-name", "payload-as-float32", "payload-off-by-one"],
)
def test_a_malformed_compressed_header_is_refused_before_allocation(change, text):
    pool = BufferPool(keep=2)
    err = refusal(tampered(change), expect(), pool)
    assert (err.code, err.reason) == ("INVALID_ARGUMENT", Reason.BAD_PAYLOAD)
    assert text in err.message
    assert len(pool) == 0  # nothing was allocated


def test_a_mix_of_full_and_compressed_tensors_is_refused_in_a_whole_message():
    msg = compressed()
    tensors = dict(msg.tensors)
    tensors["omega"] = torch.zeros(P)
    del tensors["omega.values"]
    with pytest.raises(WireError) as err:
        check_message(expect(), RoundMessage("b", 3, 2, tensors))
    assert err.value.reason is Reason.BAD_PAYLOAD


def test_compressed_parts_are_refused_where_no_compressed_set_is_expected():
    err = refusal(list(encode(compressed())), expect(None))
    assert (err.code, err.reason) == ("INVALID_ARGUMENT", Reason.BAD_PAYLOAD)
    assert "do not match" in err.message


@pytest.mark.parametrize("name", ["omega.values", "omega.half"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_half_precision_parts_are_refused(name, bad):
    msg = compressed()
    msg.tensors[name].view(-1)[5] = bad
    err = refusal(list(encode(msg, chunk_bytes=100)), expect())
    assert (err.code, err.reason) == ("INVALID_ARGUMENT", Reason.NON_FINITE)
    assert name in err.message
    with pytest.raises(WireError) as whole:  # the no-copy path refuses it the same way
        check_message(expect(), msg)
    assert whole.value.reason is Reason.NON_FINITE


def test_integer_bytes_that_read_as_nan_floats_are_accepted():
    msg = compressed()
    msg.tensors["omega.indices"][:] = -1  # 0xffffffff: a NaN if summed as float32
    msg.tensors["x.q"][:] = -1
    assert_bit_exact(decode(encode(msg, chunk_bytes=64), expect()), msg)


def test_finite_float16_values_whose_half_precision_sum_overflows_are_accepted():
    big = torch.full((4000,), 65504.0, dtype=torch.float16)
    assert not torch.isfinite(big.sum())  # a float16 sum would call it poison
    check_finite({"h": big})


def test_a_copy_reply_must_carry_the_copy_asked_for():
    g = torch.Generator().manual_seed(2)
    copy = RoundMessage("b", 3, 2, {"omega": torch.randn(P, generator=g),
                                     "x": torch.randn(P, generator=g)}, copy_next=41)
    assert_bit_exact(decode(encode(copy), expect(None, copy_next=41)), copy)
    err = refusal(list(encode(copy)), expect(None, copy_next=42))
    assert (err.code, err.reason) == ("INVALID_ARGUMENT", Reason.BAD_HEADER)
    with pytest.raises(WireError) as whole:
        check_message(expect(None, copy_next=42), copy)
    assert whole.value.reason is Reason.BAD_HEADER
