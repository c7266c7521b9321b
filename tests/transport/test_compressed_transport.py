"""Compressed states, copy pulls and byte counters over both transports: in-memory (byte for
byte, and without copies) and gRPC on 127.0.0.1."""

from __future__ import annotations

import math

import grpc
import pytest
import torch

from dacflnode._proto.dacfl.v1 import neighbor_pb2 as pb
from dacflnode._proto.dacfl.v1 import neighbor_pb2_grpc
from dacflnode.transport.base import Identity, Inbox, Transport
from dacflnode.transport.grpc_status import reason_of
from dacflnode.transport.grpc_transport import GrpcTransport
from dacflnode.transport.memory import MemoryNetwork, MemoryTransport
from dacflnode.wire.encoder import encode
from dacflnode.wire.errors import Reason, WireError
from dacflnode.wire.message import Kind, RoundMessage

P = 3001  # odd, and over several chunks of the int8 part when chunked small
MODEL, RUN = "model-fingerprint-1", "run-fingerprint-1"
FULL = {"omega": (P,), "x": (P,)}
K = 31
COMPRESSED: dict[str, tuple[torch.dtype, tuple[int, ...]]] = {
    "x.q": (torch.int8, (P,)),
    "x.scale": (torch.float32, ((P + 511) // 512,)),
    "omega.values": (torch.bfloat16, (K,)),
    "omega.indices": (torch.int32, (K,)),
}


def compressed(sender: str, round_: int, copy_base: int, copy_next: int) -> RoundMessage:
    g = torch.Generator().manual_seed(round_ + sum(map(ord, sender)))
    tensors = {
        "x.q": torch.randint(-128, 128, (P,), generator=g, dtype=torch.int8),
        "x.scale": torch.rand((P + 511) // 512, generator=g),
        "omega.values": torch.randn(K, generator=g).to(torch.bfloat16),
        "omega.indices": torch.randperm(P, generator=g)[:K].to(torch.int32),
    }
    return RoundMessage(sender, round_, 1, tensors, copy_base=copy_base, copy_next=copy_next)


def full_copy(sender: str, copy_id: int) -> RoundMessage:
    g = torch.Generator().manual_seed(copy_id)
    return RoundMessage(sender, 2, 1, {"omega": torch.randn(P, generator=g),
                                       "x": torch.randn(P, generator=g)},
                        kind=Kind.STATE, copy_next=copy_id)


def raw_bytes(tensor: torch.Tensor) -> bytes:
    return bytes(tensor.contiguous().view(-1).view(torch.uint8).numpy())


def assert_bit_exact(got: RoundMessage, sent: RoundMessage) -> None:
    assert (got.sender, got.round, got.kind, got.copy_base, got.copy_next) == (
        sent.sender, sent.round, sent.kind, sent.copy_base, sent.copy_next)
    assert list(got.tensors) == list(sent.tensors)
    for name, tensor in sent.tensors.items():
        assert (got.tensors[name].dtype, got.tensors[name].shape) == (tensor.dtype, tensor.shape)
        assert raw_bytes(got.tensors[name]) == raw_bytes(tensor), name


class Pair:
    """``a`` and ``b``, neighbours, and ``z``, who lists ``b`` but whom ``b`` does not know."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.network = MemoryNetwork(copy=kind != "memory-nocopy")
        self.round = 0
        self.copies: dict[str, dict[int, RoundMessage]] = {"a": {}, "b": {}, "z": {}}
        self.inboxes: dict[str, Inbox] = {}
        self.nodes: dict[str, Transport] = {}

    async def start(self) -> None:
        topology = {"a": ["b"], "b": ["a"], "z": ["b"]}
        for node_id, peers in topology.items():
            inbox = Inbox(senders=frozenset(peers), current_round=lambda: self.round,
                          copy_of=self.copies[node_id].get)
            identity = Identity(node_id, MODEL, RUN)
            transport: Transport
            if self.kind.startswith("memory"):
                transport = MemoryTransport(self.network, identity, peers, inbox, FULL,
                                            compressed=COMPRESSED)
            else:
                transport = GrpcTransport(identity, "127.0.0.1:0", dict.fromkeys(peers, ""),
                                          inbox, FULL, compressed=COMPRESSED)
            await transport.start()
            self.inboxes[node_id] = inbox
            self.nodes[node_id] = transport
        if self.kind == "grpc":
            for node_id, peers in topology.items():
                transport = self.nodes[node_id]
                assert isinstance(transport, GrpcTransport)
                for peer in peers:
                    other = self.nodes[peer]
                    assert isinstance(other, GrpcTransport)
                    transport.peers[peer] = f"127.0.0.1:{other.port}"

    async def close(self) -> None:
        for transport in self.nodes.values():
            await transport.stop(grace=0)


@pytest.fixture(params=["memory", "memory-nocopy", "grpc"])
async def pair(request):
    p = Pair(request.param)
    await p.start()
    yield p
    await p.close()


async def test_a_compressed_state_is_pushed_and_pulled_bit_exact_with_its_copy_ids(pair):
    a, b = pair.nodes["a"], pair.nodes["b"]
    sent = compressed("a", 0, copy_base=2**64 - 1, copy_next=5)
    await a.push("b", sent, timeout=5)
    assert_bit_exact(pair.inboxes["b"].get(0)["a"], sent)
    assert_bit_exact(await b.pull("a", 0), sent)  # a state pull gets the compressed state


async def test_a_copy_pull_returns_the_full_copy_of_that_id(pair):
    copy = full_copy("a", 77)
    pair.copies["a"][77] = copy
    got = await pair.nodes["b"].pull("a", 0, copy_id=77)
    assert_bit_exact(got, copy)
    assert all(t.dtype == torch.float32 for t in got.tensors.values())


async def test_a_copy_pull_of_an_unknown_id_is_not_found(pair):
    pair.copies["a"][77] = full_copy("a", 77)
    with pytest.raises(WireError) as err:
        await pair.nodes["b"].pull("a", 0, copy_id=78)
    assert (err.value.code, err.value.reason) == ("NOT_FOUND", Reason.NOT_KEPT)
    pair.inboxes["a"].copy_of = None  # a node that keeps no copies
    with pytest.raises(WireError) as err:
        await pair.nodes["b"].pull("a", 0, copy_id=77)
    assert (err.value.code, err.value.reason) == ("NOT_FOUND", Reason.NOT_KEPT)


async def test_a_copy_pull_by_a_stranger_is_refused_as_a_state_pull_is(pair):
    pair.copies["b"][5] = full_copy("b", 5)
    pair.round = 0
    await pair.nodes["b"].push("a", compressed("b", 0, 4, 5), timeout=5)
    z = pair.nodes["z"]
    answers = []
    for copy_id in (0, 5):
        with pytest.raises(WireError) as err:
            await z.pull("b", 0, copy_id=copy_id)
        answers.append((err.value.code, err.value.message))
    assert answers == [("PERMISSION_DENIED", "refused")] * 2


async def test_a_copy_reply_that_is_not_the_full_copy_asked_for_is_refused(pair):
    pair.copies["a"][8] = full_copy("a", 9)  # another copy's id
    pair.copies["a"][10] = compressed("a", 0, 9, 10)  # compressed, not full
    with pytest.raises(WireError) as err:
        await pair.nodes["b"].pull("a", 0, copy_id=8)
    assert (err.value.code, err.value.reason) == ("INVALID_ARGUMENT", Reason.BAD_HEADER)
    with pytest.raises(WireError) as err:
        await pair.nodes["b"].pull("a", 0, copy_id=10)
    assert (err.value.code, err.value.reason) == ("INVALID_ARGUMENT", Reason.BAD_PAYLOAD)


async def test_byte_counters_count_the_payload_of_every_state_moved_each_way(pair):
    a, b = pair.nodes["a"], pair.nodes["b"]
    pushed_ab = compressed("a", 0, 0, 1)
    pushed_ba = compressed("b", 0, 0, 1)
    copy_a = full_copy("a", 3)
    pair.copies["a"][3] = copy_a
    await a.push("b", pushed_ab, timeout=5)
    await b.push("a", pushed_ba, timeout=5)
    await b.pull("a", 0)  # a serves its state
    await b.pull("a", 0, copy_id=3)  # a serves its copy
    await a.pull("b", 0)  # b serves its state
    a_to_b = 2 * pushed_ab.payload_bytes + copy_a.payload_bytes
    b_to_a = 2 * pushed_ba.payload_bytes
    assert pushed_ab.payload_bytes == P + 4 * 6 + 2 * K + 4 * K  # what the wire carries
    assert (a.stats["b"].bytes_sent, b.stats["a"].bytes_received) == (a_to_b, a_to_b)
    assert (b.stats["a"].bytes_sent, a.stats["b"].bytes_received) == (b_to_a, b_to_a)


async def test_a_raw_grpc_copy_pull_of_an_unknown_id_gets_not_found_and_of_a_stranger_is_denied():
    pair = Pair("grpc")
    await pair.start()
    try:
        b = pair.nodes["b"]
        assert isinstance(b, GrpcTransport)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{b.port}") as channel:
            stub = neighbor_pb2_grpc.NeighborStub(channel)
            for request, code, reason in [
                (pb.PullRequest(requester="a", round=0, copy_id=12), grpc.StatusCode.NOT_FOUND,
                 Reason.NOT_KEPT),
                (pb.PullRequest(requester="mallory", round=0, copy_id=12),
                 grpc.StatusCode.PERMISSION_DENIED, Reason.NOT_NEIGHBOUR),
            ]:
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    async for _ in stub.PullState(request, timeout=5):
                        pass
                assert (err.value.code(), reason_of(err.value)) == (code, reason)
        assert b.receiver.refusals == {Reason.NOT_KEPT: 1, Reason.NOT_NEIGHBOUR: 1}
    finally:
        await pair.close()


def _wrong_dtype(h: pb.StateHeader) -> None:
    next(t for t in h.tensors if t.name == "omega.values").dtype = "float16"


def _mixed(h: pb.StateHeader) -> None:
    next(t for t in h.tensors if t.name == "x.q").name = "x"


def _payload_as_float32(h: pb.StateHeader) -> None:
    h.payload_bytes = 4 * sum(math.prod(t.shape) for t in h.tensors)


@pytest.mark.parametrize(
    ("tamper", "reason"),
    [(_wrong_dtype, Reason.BAD_PAYLOAD), (_mixed, Reason.BAD_PAYLOAD),
     (_payload_as_float32, Reason.BAD_PAYLOAD), (None, Reason.NON_FINITE)],
    ids=["wrong-dtype", "mixed-sets", "payload-bytes", "non-finite-bf16"],
)
async def test_a_hostile_compressed_push_over_grpc_gets_its_status_and_changes_nothing(
        tamper, reason):
    pair = Pair("grpc")
    await pair.start()
    try:
        b = pair.nodes["b"]
        assert isinstance(b, GrpcTransport)
        msg = compressed("a", 0, 1, 2)
        if tamper is None:
            msg.tensors["omega.values"][3] = float("inf")
        stream = list(encode(msg, chunk_bytes=512))
        if tamper is not None:
            tamper(stream[0].header)

        async def chunks():
            for chunk in stream:
                yield chunk

        async with grpc.aio.insecure_channel(f"127.0.0.1:{b.port}") as channel:
            stub = neighbor_pb2_grpc.NeighborStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.PushState(chunks(), timeout=5)
        assert (err.value.code(), reason_of(err.value)) == (
            grpc.StatusCode.INVALID_ARGUMENT, reason)
        assert pair.inboxes["b"].get(0) == {}
        assert b.stats["a"].bytes_received == 0
        await pair.nodes["a"].push("b", compressed("a", 0, 1, 2), timeout=5)  # still served
        assert pair.inboxes["b"].get(0)["a"].copy_next == 2
    finally:
        await pair.close()
