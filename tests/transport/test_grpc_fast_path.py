"""Multi-chunk states over a real gRPC server: the hand-made (de)serializers and the receiver's
worker thread deliver bit-exact states, speak protobuf's wire format to peers that use the
generated stubs, and refuse malformed streams of full 1 MiB chunks with the statuses of
docs/wire-format.md, changing nothing."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from functools import partial

import grpc
import pytest

from dacflnode._proto.dacfl.v1 import neighbor_pb2 as pb
from dacflnode._proto.dacfl.v1 import neighbor_pb2_grpc
from dacflnode.transport.base import Identity, Inbox
from dacflnode.transport.grpc_service import SERVICE_NAME, add_neighbor_service
from dacflnode.transport.grpc_status import reason_of
from dacflnode.transport.grpc_transport import GrpcTransport
from dacflnode.wire import decoder as decoder_module
from dacflnode.wire import fast_path
from dacflnode.wire.encoder import encode, make_header
from dacflnode.wire.errors import Reason
from dacflnode.wire.message import CHUNK_BYTES, RoundMessage
from tests.harness import messages as harness
from tests.transport.test_grpc_bad_input import same

P = 700_000  # 2 x 2.8 MB: three 1 MiB chunks and a short one per tensor
TENSORS = {"omega": (P,), "x": (P,)}
MODEL, RUN = "model-fingerprint-1", "run-fingerprint-1"
LOGGER = "dacflnode.transport.receiver"


message = partial(harness.message, size=P)


class Pair:
    """bob serves; alice is a neighbour; ``stub`` (generated, protobuf) and ``raw`` (bytes as
    they are) talk to bob directly."""

    def __init__(self) -> None:
        self.round = 0
        self.inbox = Inbox(senders={"alice", "carol"}, current_round=lambda: self.round)
        self.bob = GrpcTransport(Identity("bob", MODEL, RUN), "127.0.0.1:0",
                                 {"alice": "", "carol": ""}, self.inbox, TENSORS)
        self.alice: GrpcTransport
        self.channel: grpc.aio.Channel

    async def start(self) -> None:
        await self.bob.start()
        address = f"127.0.0.1:{self.bob.port}"
        self.alice = GrpcTransport(Identity("alice", MODEL, RUN), "127.0.0.1:0",
                                   {"bob": address},
                                   Inbox(senders={"bob"}, current_round=lambda: 0), TENSORS)
        await self.alice.start()
        self.bob.peers["alice"] = f"127.0.0.1:{self.alice.port}"
        self.channel = grpc.aio.insecure_channel(address)
        self.stub = neighbor_pb2_grpc.NeighborStub(self.channel)
        self.raw = self.channel.stream_unary(f"/{SERVICE_NAME}/PushState",
                                             request_serializer=bytes,
                                             response_deserializer=pb.PushReply.FromString)

    async def close(self) -> None:
        await self.channel.close()
        await self.alice.stop(grace=0)
        await self.bob.stop(grace=0)


@pytest.fixture
async def pair():
    p = Pair()
    await p.start()
    yield p
    await p.close()


async def test_a_multi_chunk_push_and_pull_are_bit_exact(pair):
    sent = message("alice", 0)
    await pair.alice.push("bob", sent, timeout=30)
    got = pair.inbox.get(0)["alice"]
    assert same(got, sent)
    assert pair.bob.stats["alice"].bytes_received == sent.payload_bytes
    assert pair.alice.stats["bob"].bytes_sent == sent.payload_bytes
    assert got.tensors["x"].data_ptr() - got.tensors["omega"].data_ptr() == 4 * P  # one buffer

    pulled = await pair.bob.pull("alice", 0, timeout=30)  # what alice published for round 0
    assert same(pulled, sent)


async def test_the_receiver_writes_large_chunks_in_its_worker_thread(pair, monkeypatch):
    threads: list[str] = []
    write = decoder_module.Decoder.write

    def spy(self, offset, data):
        import threading
        threads.append(threading.current_thread().name)
        return write(self, offset, data)

    monkeypatch.setattr(decoder_module.Decoder, "write", spy)
    sent = message("alice", 0)
    await pair.alice.push("bob", sent, timeout=30)
    assert same(pair.inbox.get(0)["alice"], sent)
    assert len(threads) == 6 and all(t.startswith("dacfl-receive") for t in threads)


async def test_the_sender_makes_each_chunk_in_a_worker_thread_and_hashes_it_once(pair,
                                                                                 monkeypatch):
    """Each data chunk is copied and hashed off the event loop, while the one before it is
    sent; a second push of the same message (another neighbour, a retry) reuses the checksum
    the first stream computed, so it hashes nothing."""
    import threading

    made: list[tuple[str, bool]] = []
    serialize = fast_path.DataSerializer.__call__

    def spy(self, view, digest=None):
        made.append((threading.current_thread().name, digest is not None))
        return serialize(self, view, digest)

    monkeypatch.setattr(fast_path.DataSerializer, "__call__", spy)
    loop_thread = threading.current_thread().name
    sent = message("alice", 0)
    await pair.alice.push("bob", sent, timeout=30)
    assert same(pair.inbox.get(0)["alice"], sent)
    assert len(made) == 6
    assert all(name != loop_thread and hashed for name, hashed in made)

    made.clear()
    pair.inbox.discard_before(1)  # bob drops it, so that the same state is accepted again
    await pair.alice.push("bob", sent, timeout=30)
    assert same(pair.inbox.get(0)["alice"], sent)  # the cached checksum verified by bob
    assert len(made) == 6 and not any(hashed for _, hashed in made)


async def test_consecutive_rounds_reuse_the_receive_buffer_and_stay_exact(pair):
    kept = []
    for round_ in range(4):
        pair.round = round_
        sent = message("alice", round_)
        await pair.alice.push("bob", sent, timeout=30)
        got = pair.inbox.get(round_)["alice"]
        assert same(got, sent)
        kept.append((sent, got) if round_ == 1 else (sent, None))
        del got
        pair.inbox.discard_before(round_)
    sent1, got1 = kept[1]
    assert got1 is not None and same(got1, sent1)  # still referenced: never overwritten
    assert len(pair.bob.receiver.pool) <= pair.bob.receiver.pool.keep


async def test_peers_using_the_generated_stubs_read_and_write_the_same_streams(pair):
    sent = message("alice", 0)

    async def chunks() -> AsyncIterator[pb.StateChunk]:
        for chunk in encode(sent):
            yield chunk

    reply = await pair.stub.PushState(chunks(), timeout=30)
    assert (reply.round, reply.received_bytes) == (0, sent.payload_bytes)
    assert same(pair.inbox.get(0)["alice"], sent)

    # a pull through the generated stub parses what the server serialized by hand
    published = message("bob", 0)
    await pair.bob._outgoing.get(published)
    stream = [c async for c in pair.stub.PullState(pb.PullRequest(requester="alice", round=0),
                                                    timeout=30)]
    assert [c.SerializeToString() for c in stream] == [
        c.SerializeToString() for c in encode(published, header=make_header(published))]


def chunks_of(msg: RoundMessage) -> list[pb.StateChunk]:
    return list(encode(msg))  # header + 1 MiB chunks


def edit(change: Callable[[list[pb.StateChunk]], None]) -> Callable[[RoundMessage],
                                                                    list[pb.StateChunk]]:
    def build(msg: RoundMessage) -> list[pb.StateChunk]:
        stream = chunks_of(msg)
        change(stream)
        return stream
    return build


def flip(stream: list[pb.StateChunk]) -> None:
    data = bytearray(stream[3].data)
    data[CHUNK_BYTES // 2] ^= 0x01
    stream[3] = pb.StateChunk(data=bytes(data))


def swap(stream: list[pb.StateChunk]) -> None:
    stream[2], stream[3] = stream[3], stream[2]


def non_finite(msg: RoundMessage) -> list[pb.StateChunk]:
    msg.tensors["x"][P // 2] = float("nan")
    return chunks_of(msg)


def oversize(stream: list[pb.StateChunk]) -> None:
    stream[0].header.payload_bytes += CHUNK_BYTES


CASES = {
    "truncated": (lambda m: chunks_of(m)[:-2], grpc.StatusCode.DATA_LOSS, Reason.TRUNCATED),
    "corrupted chunk": (edit(flip), grpc.StatusCode.DATA_LOSS, Reason.CHECKSUM),
    "chunks out of order": (edit(swap), grpc.StatusCode.DATA_LOSS, Reason.CHECKSUM),
    "one chunk too many": (lambda m: [*chunks_of(m), chunks_of(m)[1]],
                           grpc.StatusCode.INVALID_ARGUMENT, Reason.BAD_PAYLOAD),
    "oversize header": (edit(oversize), grpc.StatusCode.INVALID_ARGUMENT, Reason.BAD_PAYLOAD),
    "data before the header": (lambda m: [chunks_of(m)[1], *chunks_of(m)],
                               grpc.StatusCode.INVALID_ARGUMENT, Reason.BAD_HEADER),
    "second header": (lambda m: [*chunks_of(m)[:3], chunks_of(m)[0], *chunks_of(m)[3:]],
                      grpc.StatusCode.INVALID_ARGUMENT, Reason.BAD_HEADER),
    "NaN in a chunk": (non_finite, grpc.StatusCode.INVALID_ARGUMENT, Reason.NON_FINITE),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_a_malformed_multi_chunk_push_is_refused_as_before(pair, caplog, case):
    build, code, reason = CASES[case]
    first = message("alice", 0)
    await pair.alice.push("bob", first, timeout=30)
    kept = pair.inbox.get(0)["alice"]
    caplog.set_level(logging.WARNING, logger=LOGGER)
    caplog.clear()

    bad = build(message("carol", 0, seed=1))

    async def stream() -> AsyncIterator[pb.StateChunk]:
        for chunk in bad:
            yield chunk

    with pytest.raises(grpc.aio.AioRpcError) as err:
        await pair.stub.PushState(stream(), timeout=30)
    assert (err.value.code(), reason_of(err.value)) == (code, reason), err.value.details()
    logged = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert any(code.name in line and f"({reason.value})" in line for line in logged), logged
    assert pair.inbox.get(0) == {"alice": kept}
    assert same(kept, first)

    later = message("carol", 0, seed=2)  # the server still takes a correct push
    await pair.stub.PushState(aiter_of(encode(later)), timeout=30)
    assert same(pair.inbox.get(0)["carol"], later)
    assert same(pair.inbox.get(0)["alice"], first)


@pytest.mark.parametrize("raw", [
    [b"\xff\xff\xff"],  # not protobuf at all
    [None, b"\x12\x05abc"],  # a data chunk shorter than its length, after a valid header
])
async def test_an_undecodable_chunk_gets_protobufs_error_and_changes_nothing(pair, raw):
    header = pb.StateChunk(header=make_header(message("carol", 0))).SerializeToString()
    parts = [header if r is None else r for r in raw]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await pair.raw(aiter_of(parts), timeout=30)
    assert err.value.code() == grpc.StatusCode.UNKNOWN
    assert "DecodeError" in (err.value.details() or "")
    assert pair.inbox.get(0) == {}
    assert not pair.bob.receiver._receiving


async def aiter_of(items):
    for item in items:
        yield item


def test_the_service_registered_by_hand_serves_every_method_of_the_proto():
    class Recorder:
        def __init__(self) -> None:
            self.methods: dict[str, object] = {}

        def add_generic_rpc_handlers(self, handlers: object) -> None:
            pass

        def add_registered_method_handlers(self, service: str, methods: dict[str, object]) -> None:
            assert service == SERVICE_NAME
            self.methods = methods

    recorder = Recorder()
    servicer = type("S", (), {"Hello": None, "PushState": None, "PullState": None,
                              "Exchange": None, "Agree": None})()
    add_neighbor_service(servicer, recorder)  # type: ignore[arg-type]
    declared = pb.DESCRIPTOR.services_by_name["Neighbor"].methods_by_name
    assert set(recorder.methods) == set(declared)
    for name, method in declared.items():
        handler = recorder.methods[name]
        # every request is read as a stream, so that its first message has a deadline (a
        # unary request is a stream of one message on the wire); responses are as declared
        assert handler.request_streaming  # type: ignore[attr-defined]
        assert handler.response_streaming == method.server_streaming  # type: ignore[attr-defined]
