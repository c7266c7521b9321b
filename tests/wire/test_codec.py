import math
from functools import partial

import pytest
import torch

from dacflnode._proto.dacfl.v1 import neighbor_pb2 as pb
from dacflnode.wire.decoder import Decoder, decode
from dacflnode.wire.encoder import encode
from dacflnode.wire.errors import Reason, Refusal, WireError
from dacflnode.wire.message import CHUNK_BYTES, MAX_ANCHORS, MAX_USED_LOG
from dacflnode.wire.validation import Expectation, check_finite
from tests.harness import messages as harness

P = 1000


message = partial(harness.message, sender="b", round_=3, size=P, degree=2,
                  used_log=((2, ("a",)),))


def expect() -> Expectation:
    return Expectation(
        senders={"b", "c"}, tensors={"omega": (P,), "x": (P,)},
        accept_round=lambda r: None if r in (3, 4) else Refusal(Reason.ROUND_AHEAD, "not now"),
    )


def test_round_trip_is_bit_exact_and_keeps_the_header():
    msg = message()
    out = decode(encode(msg, chunk_bytes=1000), expect())
    assert (out.sender, out.round, out.degree, out.used) == ("b", 3, 2, ("a",))
    for name in ("omega", "x"):
        assert torch.equal(out.tensors[name], msg.tensors[name])


def test_payload_travels_in_chunks_of_at_most_one_mebibyte():
    big = message(size=600_000)  # 2 x 2.4 MB
    chunks = list(encode(big))
    sizes = [len(c.data) for c in chunks[1:-1]]
    assert chunks[0].WhichOneof("part") == "header"
    assert [c.WhichOneof("part") for c in chunks[1:]] == ["data"] * len(sizes) + ["trailer"]
    assert max(sizes) <= CHUNK_BYTES and sum(sizes) == big.payload_bytes


@pytest.mark.parametrize(
    ("mutate", "code", "reason", "text"),
    [
        (lambda h: setattr(h, "sender", "mallory"), "PERMISSION_DENIED", Reason.UNKNOWN_SENDER,
         "^refused$"),
        (lambda h: setattr(h, "round", 9), "FAILED_PRECONDITION", Reason.ROUND_AHEAD,
         "round 9 refused: not now"),
        (lambda h: setattr(h, "degree", 0), "INVALID_ARGUMENT", Reason.BAD_HEADER, "degree"),
        (lambda h: h.tensors[0].shape.__setitem__(0, P + 1), "INVALID_ARGUMENT",
         Reason.BAD_PAYLOAD, "shape"),
        (lambda h: setattr(h.tensors[1], "dtype", "float64"), "INVALID_ARGUMENT",
         Reason.BAD_PAYLOAD, "dtype"),
        (lambda h: setattr(h.tensors[1], "name", "y"), "INVALID_ARGUMENT", Reason.BAD_PAYLOAD,
         "do not match"),
        (lambda h: setattr(h, "payload_bytes", 10**12), "INVALID_ARGUMENT", Reason.BAD_PAYLOAD,
         "payload_bytes"),
        (lambda h: setattr(h, "kind", 99), "INVALID_ARGUMENT", Reason.BAD_HEADER,
         "unknown state kind"),
        (lambda h: h.used_log.add(round=3, peers=["a"]), "INVALID_ARGUMENT", Reason.BAD_HEADER,
         "used_log entry for round 3"),
        (lambda h: h.used_log.extend(pb.UsedRound(round=1) for _ in range(MAX_USED_LOG)),
         "INVALID_ARGUMENT", Reason.BAD_HEADER, "too many"),
        (lambda h: h.anchors.extend(range(5, 6 + MAX_ANCHORS)), "INVALID_ARGUMENT",
         Reason.BAD_HEADER, "too many"),
        (lambda h: h.anchors.append(0), "INVALID_ARGUMENT", Reason.BAD_HEADER, "anchor round 0"),
    ],
)
def test_bad_headers_are_refused_before_anything_is_allocated(mutate, code, reason, text):
    chunks = list(encode(message()))
    header = pb.StateHeader()
    header.CopyFrom(chunks[0].header)
    mutate(header)
    decoder = Decoder(expect())
    with pytest.raises(WireError, match=text) as err:
        decoder.header(header)
    assert err.value.code == code
    assert err.value.reason is reason
    assert decoder._buffer is None


def test_a_stranger_is_told_refused_and_only_the_log_detail_names_it():
    header = next(encode(message(sender="mallory"))).header
    with pytest.raises(WireError) as err:
        Decoder(expect()).header(header)
    assert err.value.message == "refused"
    assert "mallory" in err.value.detail


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_non_finite_payload_with_a_valid_checksum_is_refused(bad):
    msg = message()
    msg.tensors["x"][17] = bad
    with pytest.raises(WireError, match="NaN or infinite") as err:
        decode(encode(msg, chunk_bytes=1000), expect())
    assert (err.value.code, err.value.reason) == ("INVALID_ARGUMENT", Reason.NON_FINITE)


def test_check_finite_accepts_extreme_finite_values():
    check_finite({"x": torch.tensor([-0.0, 3.4028235e38, -3.4028235e38, 1e-45])})


def test_truncated_stream_is_data_loss():
    chunks = list(encode(message(), chunk_bytes=1000))
    with pytest.raises(WireError, match="truncated") as err:
        decode(iter(chunks[:-2]), expect())  # neither the last data chunk nor the trailer
    assert (err.value.code, err.value.reason) == ("DATA_LOSS", Reason.TRUNCATED)


def test_a_stream_without_its_trailer_is_data_loss():
    chunks = list(encode(message(), chunk_bytes=1000))
    with pytest.raises(WireError, match="without its checksum trailer") as err:
        decode(iter(chunks[:-1]), expect())  # every data byte, no trailer
    assert (err.value.code, err.value.reason) == ("DATA_LOSS", Reason.TRUNCATED)


def test_a_trailer_before_the_last_data_chunk_is_refused_at_the_trailer():
    chunks = list(encode(message(), chunk_bytes=1000))
    decoder = Decoder(expect())
    for chunk in chunks[:-2]:
        decoder.take(chunk)
    with pytest.raises(WireError, match="trailer after 7000 of 8000 bytes") as err:
        decoder.take(chunks[-1])
    assert (err.value.code, err.value.reason) == ("DATA_LOSS", Reason.TRUNCATED)


@pytest.mark.parametrize(
    ("after", "text", "code", "reason"),
    [
        (lambda chunks: [chunks[-1]], "second trailer", "INVALID_ARGUMENT", Reason.BAD_PAYLOAD),
        (lambda chunks: [pb.StateChunk(data=b"")], "data after the trailer", "INVALID_ARGUMENT",
         Reason.BAD_PAYLOAD),
        (lambda chunks: [chunks[1]], "data after the trailer", "INVALID_ARGUMENT",
         Reason.BAD_PAYLOAD),
        (lambda chunks: [chunks[0]], "second header", "INVALID_ARGUMENT", Reason.BAD_HEADER),
    ],
)
def test_nothing_may_follow_the_trailer(after, text, code, reason):
    chunks = list(encode(message(), chunk_bytes=1000))
    with pytest.raises(WireError, match=text) as err:
        decode(iter(chunks + after(chunks)), expect())
    assert (err.value.code, err.value.reason) == (code, reason)


def test_a_wrong_trailer_fails_the_checksum():
    chunks = list(encode(message(), chunk_bytes=1000))
    wrong = bytearray(chunks[-1].trailer)
    wrong[0] ^= 0x01
    chunks[-1] = pb.StateChunk(trailer=bytes(wrong))
    with pytest.raises(WireError, match="checksum mismatch") as err:
        decode(iter(chunks), expect())
    assert (err.value.code, err.value.reason) == ("DATA_LOSS", Reason.CHECKSUM)


@pytest.mark.parametrize("size", [0, 1, 15, 17, 64])
def test_a_trailer_that_is_not_16_bytes_is_a_bad_header(size):
    chunks = list(encode(message(), chunk_bytes=1000))
    chunks[-1] = pb.StateChunk(trailer=b"\x01" * size)
    with pytest.raises(WireError, match="16 bytes") as err:
        decode(iter(chunks), expect())
    assert (err.value.code, err.value.reason) == ("INVALID_ARGUMENT", Reason.BAD_HEADER)


def test_a_trailer_before_the_header_is_a_bad_header():
    chunks = list(encode(message(), chunk_bytes=1000))
    with pytest.raises(WireError, match="trailer before the header") as err:
        decode(iter([chunks[-1], *chunks]), expect())
    assert (err.value.code, err.value.reason) == ("INVALID_ARGUMENT", Reason.BAD_HEADER)


def test_the_trailer_hashes_the_payload_as_it_was_sent_chunk_by_chunk():
    """No pass over the payload before the first chunk: the header holds no checksum, and the
    trailer is the hash of the bytes the data chunks carried, each hashed as it was made (a
    value changed after its chunk was sent is not in it; one changed before is)."""
    msg = message()
    stream = encode(msg, chunk_bytes=1000)
    header, first = next(stream), next(stream)
    assert "checksum" not in pb.StateHeader.DESCRIPTOR.fields_by_name
    sent = msg.tensors["omega"][0].item()
    msg.tensors["omega"][0] = sent + 1.0  # already sent in the first chunk: not hashed again
    msg.tensors["x"][-1] += 1.0  # not sent yet: travels, and is hashed, changed
    rest = list(stream)
    out = decode(iter([header, first, *rest]), expect())
    assert out.tensors["omega"][0].item() == sent
    assert torch.equal(out.tensors["x"], msg.tensors["x"])


def test_corrupted_payload_fails_the_checksum():
    chunks = list(encode(message(), chunk_bytes=1000))
    data = bytearray(chunks[2].data)
    data[5] ^= 0xFF
    chunks[2] = pb.StateChunk(data=bytes(data))
    with pytest.raises(WireError, match="checksum") as err:
        decode(iter(chunks), expect())
    assert (err.value.code, err.value.reason) == ("DATA_LOSS", Reason.CHECKSUM)


def test_more_bytes_than_announced_are_refused():
    chunks = list(encode(message()))
    chunks.insert(-1, pb.StateChunk(data=b"\0" * 8))
    with pytest.raises(WireError, match="more than") as err:
        decode(iter(chunks), expect())
    assert err.value.reason is Reason.BAD_PAYLOAD


def test_data_before_header_and_double_header_are_refused():
    chunks = list(encode(message()))
    with pytest.raises(WireError, match="before the header") as err:
        decode(iter(chunks[1:]), expect())
    assert err.value.reason is Reason.BAD_HEADER
    with pytest.raises(WireError, match="second header") as err:
        decode(iter([chunks[0], chunks[0]]), expect())
    assert err.value.reason is Reason.BAD_HEADER


def test_a_wire_error_is_the_same_class_from_codec_and_errors():
    from dacflnode.wire import errors

    assert WireError is errors.WireError
    assert WireError("NOT_FOUND", "gone").reason is Reason.OTHER


@pytest.mark.parametrize(
    ("value", "reason"),
    [("round-passed", Reason.ROUND_PASSED), (b"not-kept", Reason.NOT_KEPT),
     ("from-a-newer-version", Reason.OTHER), (None, Reason.OTHER), (b"\xff", Reason.OTHER)],
)
def test_a_reason_read_from_the_wire_is_known_or_other(value, reason):
    assert Reason.parse(value) is reason
