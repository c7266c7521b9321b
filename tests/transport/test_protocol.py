"""One protocol suite, run over both transports: in-memory (byte for byte, and without copies)
and gRPC on 127.0.0.1."""

from __future__ import annotations

import asyncio
import math
import socket
import threading

import pytest
import torch

from dacflnode.learning.owndata import DataContract
from dacflnode.transport.base import (
    MAX_CONTRACT_BYTES,
    HandshakeRefused,
    Identity,
    Inbox,
    PeerUnavailable,
    Transport,
    TransportClosed,
)
from dacflnode.transport.grpc_transport import GrpcTransport
from dacflnode.transport.handshake import PeerIdentity
from dacflnode.transport.memory import MemoryNetwork, MemoryTransport
from dacflnode.transport.receiver import Receiver
from dacflnode.wire import encoder
from dacflnode.wire.errors import Reason, WireError
from dacflnode.wire.message import CHUNK_BYTES, PROTOCOL_VERSION, Kind, RoundMessage
from dacflnode.wire.state_guard import DistanceGuard

P = 64
MODEL, RUN = "model-fingerprint-1", "run-fingerprint-1"
FULL = {"a": ["b", "c"], "b": ["a", "c"], "c": ["a", "b"]}


def tensors_for(p: int) -> dict[str, tuple[int, ...]]:
    return {"omega": (p,), "x": (p,)}


def message(sender: str, round_: int, p: int = P, seed: int = 0, degree: int = 2) -> RoundMessage:
    g = torch.Generator().manual_seed(1000 * round_ + seed + sum(map(ord, sender)))
    omega = torch.randn(p, generator=g)
    x = torch.randn(p, generator=g)
    # finite values whose bits a lossy path would change (NaN and infinities are refused)
    omega[:4] = torch.tensor([-0.0, 3.4028235e38, -1.1754944e-38, 1e-45])
    log_ = ((round_ - 2, ("b",)), (round_ - 1, ("b", "c"))) if round_ >= 2 else ()
    return RoundMessage(sender, round_, degree, {"omega": omega, "x": x}, used_log=log_,
                        kind=Kind.FINAL, anchors=(round_ + 3,))


def assert_bit_exact(got: RoundMessage, sent: RoundMessage) -> None:
    assert (got.sender, got.round, got.degree, got.used_log, got.kind, got.anchors) == (
        sent.sender, sent.round, sent.degree, sent.used_log, sent.kind, sent.anchors)
    assert list(got.tensors) == list(sent.tensors)
    for name, tensor in sent.tensors.items():
        assert got.tensors[name].dtype == torch.float32
        assert got.tensors[name].shape == tensor.shape
        assert got.tensors[name].numpy().tobytes() == tensor.numpy().tobytes()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Node:
    """One node: its inbox follows ``round``, which a test moves by hand."""

    def __init__(self, node_id: str, peers: list[str]) -> None:
        self.id = node_id
        self.round = 0
        self.inbox = Inbox(senders=frozenset(peers), current_round=lambda: self.round)
        self.transport: Transport


class Cluster:
    """A few nodes on one transport kind; ``absent`` peers are configured but never started."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.network = MemoryNetwork(copy=kind != "memory-nocopy")
        self.nodes: dict[str, Node] = {}

    async def build(
        self,
        topology: dict[str, list[str]],
        identities: dict[str, Identity] | None = None,
        p: int = P,
    ) -> dict[str, Node]:
        identities = identities or {}
        for node_id, peers in topology.items():
            identity = identities.get(node_id, Identity(node_id, MODEL, RUN))
            node = Node(node_id, peers)
            if self.kind.startswith("memory"):
                node.transport = MemoryTransport(self.network, identity, peers, node.inbox,
                                                 tensors_for(p))
            else:
                node.transport = GrpcTransport(identity, "127.0.0.1:0", dict.fromkeys(peers, ""),
                                               node.inbox, tensors_for(p))
            await node.transport.start()
            self.nodes[node_id] = node
        if self.kind == "grpc":
            for node_id, peers in topology.items():
                transport = self.nodes[node_id].transport
                assert isinstance(transport, GrpcTransport)
                for peer in peers:
                    other = self.nodes.get(peer)
                    port = closed_port()
                    if other is not None:
                        assert isinstance(other.transport, GrpcTransport)
                        port = other.transport.port or port
                    transport.peers[peer] = f"127.0.0.1:{port}"
        return self.nodes

    async def close(self) -> None:
        for node in self.nodes.values():
            await node.transport.stop(grace=0)


@pytest.fixture(params=["memory", "memory-nocopy", "grpc"])
async def cluster(request):
    c = Cluster(request.param)
    yield c
    await c.close()


async def test_handshake_succeeds_and_records_connected(cluster):
    nodes = await cluster.build(FULL)
    a, b = nodes["a"].transport, nodes["b"].transport
    assert not a.stats["b"].connected
    ident = await a.hello("b")
    assert ident == PeerIdentity("b", MODEL, RUN, PROTOCOL_VERSION, round=0)
    assert a.stats["b"].connected and b.stats["a"].connected
    assert a.stats["b"].latency_ms >= 0.0
    assert not a.stats["c"].connected
    nodes["b"].round = 3
    assert (await a.hello("b")).round == 3  # the reply says which round the neighbour is in


@pytest.mark.parametrize(
    ("other", "reason"),
    [
        (Identity("c", "another-model", RUN), "model"),
        (Identity("c", MODEL, "another-run"), "run settings"),
        (Identity("c", MODEL, RUN, PROTOCOL_VERSION + 1), "protocol version"),
        # version 2 sent the checksum in the header: its streams would lack the trailer
        (Identity("c", MODEL, RUN, 2), "protocol version [23] .*same dacflnode release"),
    ],
    ids=["model", "run", "protocol", "checksum-in-the-header"],
)
async def test_handshake_with_a_different_identity_is_refused(cluster, other, reason):
    nodes = await cluster.build(FULL, identities={"c": other})
    with pytest.raises(HandshakeRefused, match=reason) as err:
        await nodes["c"].transport.hello("a")  # refused by a
    assert err.value.reason is Reason.MISMATCH
    with pytest.raises(HandshakeRefused, match=reason) as err:
        await nodes["a"].transport.hello("c")  # refused by a, on reading c's reply
    assert err.value.reason is Reason.MISMATCH
    assert not nodes["a"].transport.stats["c"].connected
    await nodes["a"].transport.hello("b")  # the others still talk


def contract(classes: list[str], shape: tuple[int, ...] = (1, 28, 28)) -> str:
    return DataContract("folder", tuple(classes), shape).to_json()


@pytest.mark.parametrize(
    ("theirs", "message"),
    [
        (contract(["cat", "dog"]), "c has classes ['cat', 'dog'], this run ['cat', 'dog', 'eel']"),
        (contract(["cat", "dog", "eel"], (3, 28, 28)),
         "c has input shape 3x28x28, this run 1x28x28"),
        ("", "c trains on a built-in data set, this run on own data"),
        ("{not json", "c sent a data contract this node cannot read"),
        ("x" * (MAX_CONTRACT_BYTES + 1), f"over {MAX_CONTRACT_BYTES} bytes"),
    ],
    ids=["classes", "shape", "built-in", "garbage", "too-long"],
)
async def test_a_node_whose_data_contract_differs_is_refused_naming_the_difference(
    cluster, theirs, message
):
    mine = contract(["cat", "dog", "eel"])
    identities = {n: Identity(n, MODEL, RUN, data_contract=mine) for n in ("a", "b")}
    # the run fingerprints differ too (they hash the contract): the contract is named first
    identities["c"] = Identity("c", MODEL, "another-run", data_contract=theirs)
    nodes = await cluster.build(FULL, identities=identities)
    with pytest.raises(HandshakeRefused) as err:
        await nodes["c"].transport.hello("a")  # refused by a, which names c's difference
    assert "a refuses c: " in str(err.value) and message in str(err.value)
    assert err.value.reason is Reason.MISMATCH
    await nodes["a"].transport.hello("b")  # equal contracts talk
    assert not nodes["a"].transport.stats["c"].connected


async def test_a_node_that_is_not_a_neighbour_is_refused(cluster):
    nodes = await cluster.build({"a": ["b"], "b": ["a"], "z": ["b"]})
    nodes["b"].round = 3
    with pytest.raises(HandshakeRefused) as refused:
        await nodes["z"].transport.hello("b")
    assert (str(refused.value), refused.value.reason) == ("refused", Reason.NOT_NEIGHBOUR)
    with pytest.raises(WireError) as err:
        await nodes["z"].transport.push("b", message("z", 3), timeout=5)
    assert (err.value.code, err.value.message, err.value.reason) == (
        "PERMISSION_DENIED", "refused", Reason.UNKNOWN_SENDER)
    with pytest.raises(WireError) as err:
        await nodes["z"].transport.pull("b", 3)
    assert (err.value.code, err.value.message, err.value.reason) == (
        "PERMISSION_DENIED", "refused", Reason.NOT_NEIGHBOUR)
    assert receiver_of(nodes["b"]).refusals == {Reason.NOT_NEIGHBOUR: 2,
                                                Reason.UNKNOWN_SENDER: 1}
    assert nodes["b"].inbox.get(0) == {}
    with pytest.raises(ValueError, match="not a neighbour"):
        await nodes["a"].transport.push("z", message("a", 0), timeout=5)


async def test_a_pushed_message_arrives_bit_exact(cluster):
    nodes = await cluster.build(FULL)
    sent = message("a", 0)
    await nodes["a"].transport.push("b", sent, timeout=5)
    got = await nodes["b"].inbox.wait(0, ["a"], timeout=5)
    assert_bit_exact(got["a"], sent)
    assert nodes["a"].transport.stats["b"].bytes_sent == sent.payload_bytes
    b_stats = nodes["b"].transport.stats["a"]
    assert (b_stats.bytes_received, b_stats.last_round_received) == (sent.payload_bytes, 0)
    assert nodes["c"].inbox.get(0) == {}


async def test_non_contiguous_tensors_travel_as_their_values(cluster):
    nodes = await cluster.build(FULL)
    base = message("a", 0, p=2 * P)
    strided = RoundMessage("a", 0, 2, {"omega": base.tensors["omega"][::2],
                                       "x": base.tensors["x"].view(P, 2)[:, 1]})
    assert not any(t.is_contiguous() for t in strided.tensors.values())
    await nodes["a"].transport.push("b", strided, timeout=5)
    got = nodes["b"].inbox.get(0)["a"]
    for name, tensor in strided.tensors.items():
        assert got.tensors[name].numpy().tobytes() == tensor.contiguous().numpy().tobytes()
    assert_bit_exact(await nodes["c"].transport.pull("a", 0), got)


async def test_a_multi_chunk_payload_arrives_bit_exact(cluster):
    p = 3 * CHUNK_BYTES // 8 + 1000  # two tensors, ~3 MiB in all: 4 chunks
    nodes = await cluster.build({"a": ["b"], "b": ["a"]}, p=p)
    sent = message("a", 0, p=p, degree=1)
    assert sent.payload_bytes > 3 * CHUNK_BYTES
    await nodes["a"].transport.push("b", sent, timeout=20)
    got = await nodes["b"].inbox.wait(0, ["a"], timeout=5)
    assert_bit_exact(got["a"], sent)
    assert nodes["b"].transport.stats["a"].bytes_received == sent.payload_bytes
    assert_bit_exact(await nodes["b"].transport.pull("a", 0, timeout=20), sent)


async def test_the_next_round_is_buffered_and_never_mixed_with_the_current(cluster):
    nodes = await cluster.build(FULL)
    a, c = nodes["a"].transport, nodes["c"].transport
    early = message("a", 1)  # a finished round 0 before b did
    await a.push("b", early, timeout=5)
    await c.push("b", message("c", 0), timeout=5)
    now = await nodes["b"].inbox.wait(0, ["a", "c"], timeout=0.2)
    assert set(now) == {"c"}  # a's round-1 state does not stand in for its round-0 state
    await a.push("b", late := message("a", 0, seed=7), timeout=5)
    now = await nodes["b"].inbox.wait(0, ["a", "c"], timeout=5)
    assert_bit_exact(now["a"], late)

    waiter = asyncio.create_task(nodes["b"].inbox.wait(1, ["a", "c"], timeout=5))
    nodes["b"].round = 1
    nodes["b"].inbox.discard_before(1)
    await c.push("b", c1 := message("c", 1), timeout=5)
    nxt = await waiter
    assert set(nxt) == {"a", "c"}
    assert_bit_exact(nxt["a"], early)
    assert_bit_exact(nxt["c"], c1)
    assert nodes["b"].inbox.get(0) == {}


@pytest.mark.parametrize(("round_", "reason"),
                         [(1, Reason.ROUND_PASSED), (4, Reason.ROUND_AHEAD)])
async def test_passed_and_too_far_rounds_are_refused_with_a_typed_reason(cluster, round_, reason):
    nodes = await cluster.build(FULL)
    nodes["b"].round = 2
    with pytest.raises(WireError) as err:
        await nodes["a"].transport.push("b", message("a", round_), timeout=5)
    assert (err.value.code, err.value.reason) == ("FAILED_PRECONDITION", reason)
    assert all(nodes["b"].inbox.get(r) == {} for r in range(6))
    await nodes["a"].transport.push("b", ok := message("a", 3), timeout=5)  # current + 1
    assert_bit_exact(nodes["b"].inbox.get(3)["a"], ok)


async def test_push_to_a_stopped_or_absent_peer_is_unavailable(cluster):
    nodes = await cluster.build({"a": ["b", "ghost"], "b": ["a"]})
    a = nodes["a"].transport
    await a.hello("b")
    await a.push("b", message("a", 0), timeout=5)
    await nodes["b"].transport.stop(grace=0)
    with pytest.raises(PeerUnavailable):
        await a.push("b", message("a", 1), timeout=5)
    assert not a.stats["b"].connected
    with pytest.raises(PeerUnavailable):
        await a.hello("b")
    with pytest.raises(PeerUnavailable):
        await a.hello("ghost")
    with pytest.raises(PeerUnavailable):
        await a.push("ghost", message("a", 0), timeout=5)


async def test_pull_returns_what_was_published(cluster):
    nodes = await cluster.build(FULL)
    a, b = nodes["a"].transport, nodes["b"].transport
    sent = message("a", 0)
    await a.push("c", sent, timeout=5)  # pushing publishes: b can pull it later
    assert_bit_exact(await b.pull("a", 0), sent)
    with pytest.raises(WireError) as err:
        await b.pull("a", 1)
    assert (err.value.code, err.value.reason) == ("NOT_FOUND", Reason.NOT_KEPT)
    # only the newest two rounds are kept
    for r in (1, 2):
        nodes["c"].round = r
        await a.push("c", message("a", r), timeout=5)
    with pytest.raises(WireError) as err:
        await b.pull("a", 0)
    assert err.value.reason is Reason.NOT_KEPT
    assert_bit_exact(await b.pull("a", 2), message("a", 2))


async def test_the_header_is_hashed_once_per_message(cluster, monkeypatch):
    calls = []
    real = encoder.make_header

    def counting(msg):
        calls.append(msg.round)
        return real(msg)

    monkeypatch.setattr("dacflnode.transport.outgoing.make_header", counting)
    nodes = await cluster.build(FULL)
    a = nodes["a"].transport
    sent = message("a", 0)
    await asyncio.gather(a.push("b", sent, timeout=5), a.push("c", sent, timeout=5))
    with pytest.raises(WireError) as err:  # a retry: refused, b has it already
        await a.push("b", sent, timeout=5)
    assert (err.value.code, err.value.reason) == ("ALREADY_EXISTS", Reason.DUPLICATE)
    hashed = [] if cluster.kind == "memory-nocopy" else [0]  # no copy: nothing is encoded
    assert calls == hashed
    await a.push("b", message("a", 1), timeout=5)
    assert calls == ([*hashed, 1] if hashed else [])
    got = await nodes["c"].inbox.wait(0, ["a"], timeout=5)
    assert_bit_exact(got["a"], sent)


async def test_memory_partition_and_heal():
    c = Cluster("memory")
    nodes = await c.build(FULL)
    a = nodes["a"].transport
    c.network.partition("a", "b")
    with pytest.raises(PeerUnavailable, match="partitioned"):
        await a.push("b", message("a", 0), timeout=5)
    with pytest.raises(PeerUnavailable):
        await nodes["b"].transport.hello("a")
    await a.push("c", message("a", 0), timeout=5)  # other links are untouched
    c.network.heal("a", "b")
    await a.push("b", sent := message("a", 0), timeout=5)
    assert_bit_exact(nodes["b"].inbox.get(0)["a"], sent)
    await c.close()


async def test_refusals_carry_the_same_code_and_reason_on_every_transport(cluster):
    nodes = await cluster.build({"a": ["b"], "b": ["a"], "z": ["b"]})
    a = nodes["a"].transport
    nodes["b"].round = 2
    cases = [
        (a, message("a", 1), ("FAILED_PRECONDITION", Reason.ROUND_PASSED)),
        (a, message("a", 2, p=P + 1), ("INVALID_ARGUMENT", Reason.BAD_PAYLOAD)),
        (a, RoundMessage("a", 2, 1, {"omega": torch.zeros(P)}),
         ("INVALID_ARGUMENT", Reason.BAD_PAYLOAD)),
        (a, message("a", 2, degree=0), ("INVALID_ARGUMENT", Reason.BAD_HEADER)),
        (nodes["z"].transport, message("z", 2), ("PERMISSION_DENIED", Reason.UNKNOWN_SENDER)),
    ]
    for sender, msg, expected in cases:
        with pytest.raises(WireError) as err:
            await sender.push("b", msg, timeout=5)
        assert (err.value.code, err.value.reason) == expected, err.value
    assert all(nodes["b"].inbox.get(r) == {} for r in range(4))
    assert nodes["b"].transport.stats["a"].bytes_received == 0


async def test_a_stopped_transport_refuses_new_calls(cluster):
    nodes = await cluster.build(FULL)
    a = nodes["a"].transport
    await a.hello("b")
    await a.push("b", message("a", 0), timeout=5)
    await a.stop(grace=0)
    with pytest.raises(TransportClosed):
        await a.hello("b")
    with pytest.raises(TransportClosed):
        await a.push("c", message("a", 0), timeout=5)
    with pytest.raises(TransportClosed):
        await a.pull("b", 0)
    if isinstance(a, GrpcTransport):
        assert a._channels == {}  # nothing was reopened
    await nodes["b"].transport.push("c", message("b", 0), timeout=5)  # the others still talk


async def test_the_receiver_gets_its_own_copy_unless_the_network_does_not_copy(cluster):
    nodes = await cluster.build(FULL)
    sent = message("a", 0)
    await nodes["a"].transport.push("b", sent, timeout=5)
    got = nodes["b"].inbox.get(0)["a"]
    pulled = await nodes["c"].transport.pull("a", 0)
    for name, tensor in sent.tensors.items():
        if cluster.kind == "memory-nocopy":
            assert got.tensors[name] is tensor and pulled.tensors[name] is tensor
        else:
            assert got.tensors[name].data_ptr() != tensor.data_ptr()
            assert pulled.tensors[name].data_ptr() not in (tensor.data_ptr(),
                                                            got.tensors[name].data_ptr())
    assert nodes["a"].transport.stats["b"].bytes_sent == sent.payload_bytes
    assert nodes["c"].transport.stats["a"].bytes_received == sent.payload_bytes


async def test_a_pull_refuses_a_state_that_does_not_match_what_it_expects(cluster):
    nodes = await cluster.build(FULL)
    await nodes["a"].transport.push("b", message("a", 0), timeout=5)
    with pytest.raises(WireError) as err:
        await nodes["c"].transport.pull("a", 0, expect_tensors=tensors_for(P + 1))
    assert (err.value.code, err.value.reason) == ("INVALID_ARGUMENT", Reason.BAD_PAYLOAD)


async def test_a_push_cut_off_by_stop_while_its_state_is_prepared_raises_transport_closed(
    cluster, monkeypatch
):
    if cluster.kind == "memory-nocopy":
        pytest.skip("without copies nothing is prepared")
    held = threading.Event()
    release = threading.Event()
    real = encoder.make_header

    def slow(msg):
        held.set()
        release.wait(10)
        return real(msg)

    monkeypatch.setattr("dacflnode.transport.outgoing.make_header", slow)
    nodes = await cluster.build(FULL)
    a = nodes["a"].transport
    push = asyncio.create_task(a.push("b", message("a", 0), timeout=5))
    try:
        await asyncio.to_thread(held.wait, 5)
        await a.stop(grace=0)
    finally:
        release.set()
    with pytest.raises(TransportClosed):
        await asyncio.wait_for(push, 5)
    assert nodes["b"].inbox.get(0) == {}


def receiver_of(node: Node) -> Receiver:
    receiver = getattr(node.transport, "receiver", None)
    assert isinstance(receiver, Receiver)
    return receiver


async def test_a_non_finite_state_from_a_member_is_refused_and_counted(cluster):
    nodes = await cluster.build(FULL)
    kept = message("c", 0)
    await nodes["c"].transport.push("b", kept, timeout=5)
    for i, bad in enumerate((math.nan, math.inf, -math.inf)):
        poisoned = message("a", 0, seed=i)
        poisoned.tensors["x"][7] = bad
        with pytest.raises(WireError) as err:
            await nodes["a"].transport.push("b", poisoned, timeout=5)
        assert (err.value.code, err.value.reason) == ("INVALID_ARGUMENT", Reason.NON_FINITE)
    assert set(nodes["b"].inbox.get(0)) == {"c"}
    assert_bit_exact(nodes["b"].inbox.get(0)["c"], kept)
    assert receiver_of(nodes["b"]).refusals == {Reason.NON_FINITE: 3}
    assert nodes["b"].transport.stats["a"].bytes_received == 0
    await nodes["a"].transport.push("b", ok := message("a", 0), timeout=5)  # still served
    assert_bit_exact(nodes["b"].inbox.get(0)["a"], ok)


async def test_a_forged_huge_state_with_a_valid_checksum_is_refused_by_the_guard(cluster):
    nodes = await cluster.build(FULL)
    g = torch.Generator().manual_seed(3)
    own = RoundMessage("b", 0, 2, {n: torch.randn(P, generator=g) for n in ("omega", "x")})
    nodes["b"].inbox.guard = DistanceGuard(lambda: own.tensors)
    forged = RoundMessage("a", 0, 2, {n: torch.full((P,), 1e6) for n in ("omega", "x")})
    with pytest.raises(WireError) as err:
        await nodes["a"].transport.push("b", forged, timeout=5)
    assert (err.value.code, err.value.reason) == ("INVALID_ARGUMENT", Reason.ABSURD_STATE)
    assert nodes["b"].inbox.get(0) == {}
    assert receiver_of(nodes["b"]).refusals == {Reason.ABSURD_STATE: 1}
    honest = RoundMessage("a", 0, 2, {n: t + 0.01 for n, t in own.tensors.items()})
    await nodes["a"].transport.push("b", honest, timeout=5)
    assert_bit_exact(nodes["b"].inbox.get(0)["a"], honest)


async def test_one_push_per_sender_and_round_a_duplicate_changes_nothing(cluster):
    nodes = await cluster.build(FULL)
    first = message("a", 0)
    await nodes["a"].transport.push("b", first, timeout=5)
    received = nodes["b"].transport.stats["a"].bytes_received
    with pytest.raises(WireError) as err:
        await nodes["a"].transport.push("b", message("a", 0, seed=5), timeout=5)
    assert (err.value.code, err.value.reason) == ("ALREADY_EXISTS", Reason.DUPLICATE)
    assert_bit_exact(nodes["b"].inbox.get(0)["a"], first)
    assert nodes["b"].transport.stats["a"].bytes_received == received
    assert receiver_of(nodes["b"]).refusals == {Reason.DUPLICATE: 1}


async def test_strangers_get_one_uniform_answer_that_leaks_nothing(cluster):
    nodes = await cluster.build({"a": ["b"], "b": ["a"], "z": ["b"]})
    nodes["b"].round = 5
    z = nodes["z"].transport
    answers = []
    with pytest.raises(HandshakeRefused) as refused:
        await z.hello("b")
    answers.append(str(refused.value))
    for attempt in (z.push("b", message("z", 5, p=P + 3), timeout=5), z.pull("b", 5)):
        with pytest.raises(WireError) as err:
            await attempt
        assert err.value.code == "PERMISSION_DENIED"
        answers.append(err.value.message)
    assert answers == ["refused"] * 3  # no round 5, no shape, no name of a member
    assert nodes["b"].inbox.get(5) == {}


async def test_refusals_are_counted_per_neighbour_and_late_states_apart(cluster):
    nodes = await cluster.build({"a": ["b"], "b": ["a", "c"], "c": ["b"], "z": ["b"]})
    nodes["b"].round = 2
    with pytest.raises(WireError):  # a's round-1 state comes after b left round 1
        await nodes["a"].transport.push("b", message("a", 1), timeout=5)
    await nodes["c"].transport.push("b", message("c", 2), timeout=5)
    with pytest.raises(WireError):  # a duplicate: refused, not late
        await nodes["c"].transport.push("b", message("c", 2, seed=1), timeout=5)
    with pytest.raises(WireError):  # a stranger is not counted by name
        await nodes["z"].transport.push("b", message("z", 2), timeout=5)
    receiver = receiver_of(nodes["b"])
    assert receiver.refused_by == {"a": 1, "c": 1}
    assert receiver.late_by == {"a": 1}
