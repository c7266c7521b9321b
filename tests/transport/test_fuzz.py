"""Fuzzing the receiving side: the decoder, the receiver (as the in-memory transport drives it)
and the gRPC servicer behind a real server, with generated and mutated messages.

Every case starts from a valid stream (header + chunks) of a random state and mutates it:
flipped bytes, truncation, dropped, duplicated and reordered chunks, extra headers, empty and
random chunks, wrong and huge declared sizes and shapes, random header fields, senders, rounds,
degrees and dtypes, NaN, infinite and absurdly large payloads with valid checksums, and forged
identities. Hello and PullState requests with random fields go to the server too.

Pass means: nothing but a :class:`WireError` (or, over gRPC, a status) comes out; every refusal
has the status code its :class:`Reason` defines (strangers are told "refused" and nothing else);
a refusal changes nothing (the inbox is the same, exactly one counter grew by one); and whatever
is accepted is a valid state (a neighbour's, finite, of the round window, of the right shapes).
Examples are derandomized (the same cases every run) and the counts and outcomes are printed.
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dacflnode._proto.dacfl.v1 import neighbor_pb2 as pb
from dacflnode._proto.dacfl.v1 import neighbor_pb2_grpc
from dacflnode.transport.base import Identity, Inbox
from dacflnode.transport.grpc_status import reason_of
from dacflnode.transport.grpc_transport import GrpcTransport
from dacflnode.transport.receiver import Receiver
from dacflnode.wire.decoder import decode
from dacflnode.wire.encoder import checksum, encode
from dacflnode.wire.errors import Reason, WireError
from dacflnode.wire.message import RoundMessage
from dacflnode.wire.state_guard import DistanceGuard
from dacflnode.wire.validation import Expectation

pytestmark = pytest.mark.slow

P = 6
TENSORS = {"omega": (P,), "x": (P,)}
MODEL, RUN = "model-fingerprint-1", "run-fingerprint-1"
MEMBERS = frozenset({"alice", "carol"})
#: The status code each refusal reason is answered with.
DEFINED = {
    Reason.UNKNOWN_SENDER: "PERMISSION_DENIED", Reason.NOT_AUTHENTICATED: "PERMISSION_DENIED",
    Reason.NOT_NEIGHBOUR: "PERMISSION_DENIED", Reason.ROUND_PASSED: "FAILED_PRECONDITION",
    Reason.ROUND_AHEAD: "FAILED_PRECONDITION", Reason.MISMATCH: "FAILED_PRECONDITION",
    Reason.BAD_HEADER: "INVALID_ARGUMENT", Reason.BAD_PAYLOAD: "INVALID_ARGUMENT",
    Reason.NON_FINITE: "INVALID_ARGUMENT", Reason.ABSURD_STATE: "INVALID_ARGUMENT",
    Reason.STALE_STATE: "INVALID_ARGUMENT", Reason.QUARANTINED: "PERMISSION_DENIED",
    Reason.CHECKSUM: "DATA_LOSS", Reason.TRUNCATED: "DATA_LOSS",
    Reason.DUPLICATE: "ALREADY_EXISTS", Reason.IN_PROGRESS: "ABORTED",
    Reason.IDLE: "RESOURCE_EXHAUSTED", Reason.TOO_SLOW: "RESOURCE_EXHAUSTED",
    Reason.NOT_KEPT: "NOT_FOUND",
}
STRANGERS = {Reason.UNKNOWN_SENDER, Reason.NOT_AUTHENTICATED, Reason.NOT_NEIGHBOUR}
#: Examples per target; together at least 1000 messages per run.
EXAMPLES = {"decoder": 500, "receiver": 350, "grpc": 250}
FUZZ = settings(deadline=None, derandomize=True, database=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# ---------------------------------------------------------------- strategies
# mostly members and rounds of the window (1 and 2), so that most cases get past the first checks
senders = st.sampled_from(["alice"] * 10 + ["carol"] * 5
                          + ["mallory", "", "alice\n", "bob", "a" * 300])
rounds = st.integers(0, 9).flatmap(
    lambda k: st.integers(0, 2**64 - 1) if k == 0
    else st.sampled_from([1] * 6 + [2] * 3 + [0, 3, 7, 2**64 - 1]))
values = st.sampled_from(["normal", "nan", "inf", "-inf", "huge", "zero", "tiny"])


def payload(kind: str, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    tensors = {name: torch.randn(P, generator=g) for name in TENSORS}
    special = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "huge": 1e6, "zero": 0.0,
               "tiny": 1e-45}
    if kind in special:
        position = seed % P
        if kind == "huge":
            tensors["x"].fill_(1e6)  # the forged all-1e6 state, with a valid checksum
        else:
            tensors["x"][position] = special[kind]
    return tensors


def flip(chunks: list[pb.StateChunk], i: int, byte: int, mask: int) -> None:
    data = [k for k, c in enumerate(chunks) if c.WhichOneof("part") == "data"]
    if not data:
        return
    k = data[i % len(data)]
    raw = bytearray(chunks[k].data)
    if raw:
        raw[byte % len(raw)] ^= mask or 1
    chunks[k] = pb.StateChunk(data=bytes(raw))


def header_of(chunks: list[pb.StateChunk]) -> pb.StateHeader | None:
    for chunk in chunks:
        if chunk.WhichOneof("part") == "header":
            return chunk.header
    return None


def random_chunk(raw: bytes) -> pb.StateChunk:
    try:
        return pb.StateChunk.FromString(raw)  # whatever fields those bytes happen to hold
    except Exception:  # not a protobuf message: send the bytes as data
        return pb.StateChunk(data=raw)


Mutation = Callable[[list[pb.StateChunk]], None]


def _set_header(field: str, value: Any) -> Mutation:
    def apply(chunks: list[pb.StateChunk]) -> None:
        h = header_of(chunks)
        if h is not None:
            setattr(h, field, value)
    return apply


def _set_spec(i: int, field: str, value: Any) -> Mutation:
    def apply(chunks: list[pb.StateChunk]) -> None:
        h = header_of(chunks)
        if h is not None and h.tensors:
            spec = h.tensors[i % len(h.tensors)]
            if field == "shape":
                del spec.shape[:]
                spec.shape.extend(value)
            else:
                setattr(spec, field, value)
    return apply


def _set_trailer(value: bytes) -> Mutation:
    """Replace the stream's (first) trailer by ``value``."""
    def apply(chunks: list[pb.StateChunk]) -> None:
        for k, chunk in enumerate(chunks):
            if chunk.WhichOneof("part") == "trailer":
                chunks[k] = pb.StateChunk(trailer=value)
                return
    return apply


def _resum(chunks: list[pb.StateChunk]) -> None:
    """Make every trailer's checksum match whatever data the stream now carries."""
    data = [memoryview(c.data) for c in chunks if c.WhichOneof("part") == "data"]
    for k, chunk in enumerate(chunks):
        if chunk.WhichOneof("part") == "trailer":
            chunks[k] = pb.StateChunk(trailer=checksum(data))


flips: st.SearchStrategy[Mutation] = st.builds(
    lambda i, b, m: lambda c: flip(c, i, b, m),
    st.integers(0, 50), st.integers(0, 10**6), st.integers(0, 255))
others: st.SearchStrategy[Mutation] = st.one_of(
    st.integers(1, 5).map(lambda k: lambda c: c.__delitem__(slice(max(1, len(c) - k), None))),
    st.integers(0, 50).map(lambda i: lambda c: c.pop(i % len(c)) if c else None),
    st.tuples(st.integers(0, 50), st.integers(0, 50)).map(
        lambda ij: lambda c: c.insert(ij[1] % (len(c) + 1), c[ij[0] % len(c)]) if c else None),
    st.randoms(use_true_random=False).map(lambda r: lambda c: r.shuffle(c)),
    st.integers(0, 50).map(lambda i: lambda c: c.insert(i % (len(c) + 1), pb.StateChunk())),
    st.tuples(st.integers(0, 50), st.binary(max_size=64)).map(
        lambda ib: lambda c: c.insert(ib[0] % (len(c) + 1), random_chunk(ib[1]))),
    st.tuples(st.integers(0, 50), senders, rounds).map(
        lambda isr: lambda c: c.insert(isr[0] % (len(c) + 1), pb.StateChunk(
            header=pb.StateHeader(sender=isr[1], round=isr[2], degree=1)))),
    senders.map(lambda s: _set_header("sender", s)),
    rounds.map(lambda r: _set_header("round", r)),
    st.integers(0, 2**32 - 1).map(lambda d: _set_header("degree", d)),
    st.sampled_from([0, 4, 4 * P, 8 * P - 1, 8 * P + 4, 2**40, 2**64 - 1]).map(
        lambda n: _set_header("payload_bytes", n)),
    st.binary(max_size=40).map(_set_trailer),
    st.tuples(st.integers(0, 3), st.sampled_from(["name", "dtype"]),
              st.sampled_from(["x", "omega", "y", "", "float64", "float32", "int8"])).map(
        lambda t: _set_spec(*t)),
    st.tuples(st.integers(0, 3),
              st.lists(st.sampled_from([0, 1, P, P + 1, 2**40, 2**64 - 1]), max_size=3)).map(
        lambda t: _set_spec(t[0], "shape", t[1])),
    st.just(_resum),
)
#: Half of the mutations flip payload bytes (the commonest corruption), half are the others.
mutations: st.SearchStrategy[Mutation] = st.booleans().flatmap(lambda f: flips if f else others)


@st.composite
def push_cases(draw: st.DrawFn) -> tuple[list[pb.StateChunk], frozenset[str] | None]:
    """A valid stream of a random state, mutated 0 to 3 times; and who the caller is."""
    sender = draw(senders)
    message = RoundMessage(sender, draw(rounds),
                           draw(st.integers(1, 3)),
                           payload(draw(values), draw(st.integers(0, 1000))))
    chunks = list(encode(message, chunk_bytes=draw(st.sampled_from([4, 8, 20, 48, 1024]))))
    for mutate in draw(st.lists(mutations, max_size=3)):
        mutate(chunks)
    peer_ids = draw(st.sampled_from([None, None, frozenset({sender}), frozenset({"alice"}),
                                     frozenset({"mallory"}), frozenset()]))
    return chunks, peer_ids


# ---------------------------------------------------------------- oracles
def assert_defined(exc: WireError) -> None:
    assert DEFINED.get(exc.reason) == exc.code, exc
    if exc.reason in STRANGERS:
        assert exc.message == "refused", exc


def snapshot(inbox: Inbox) -> dict[tuple[int, str], bytes]:
    return {(r, s): b"".join(t.numpy().tobytes() for t in m.tensors.values())
            for r in range(3) for s, m in inbox.get(r).items()}


def assert_valid(message: RoundMessage, rounds_ok: set[int]) -> None:
    assert message.sender in MEMBERS and message.round in rounds_ok
    assert {n: tuple(t.shape) for n, t in message.tensors.items()} == TENSORS
    assert all(bool(torch.isfinite(t).all()) for t in message.tensors.values())


def report(target: str, outcomes: Counter[str], capsys: pytest.CaptureFixture[str]) -> None:
    with capsys.disabled():
        print(f"\nfuzz {target}: {sum(outcomes.values())} messages: "
              + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())))


def guarded_inbox() -> Inbox:
    g = torch.Generator().manual_seed(99)
    own = {name: torch.randn(P, generator=g) for name in TENSORS}
    return Inbox(senders=MEMBERS, current_round=lambda: 1, guard=DistanceGuard(lambda: own))


# ---------------------------------------------------------------- targets
def test_fuzz_the_decoder(capsys: pytest.CaptureFixture[str]) -> None:
    outcomes: Counter[str] = Counter()
    expect = Expectation(senders=MEMBERS, tensors=TENSORS,
                         accept_round=guarded_inbox().refusal)

    @settings(FUZZ, max_examples=EXAMPLES["decoder"])
    @given(push_cases())
    def one(case: tuple[list[pb.StateChunk], frozenset[str] | None]) -> None:
        chunks, _ = case
        try:
            message = decode(iter(chunks), expect)
        except WireError as exc:
            assert_defined(exc)
            outcomes[exc.reason.value] += 1
            return
        assert_valid(message, {1, 2})
        outcomes["accepted"] += 1

    one()
    report("decoder", outcomes, capsys)
    assert sum(outcomes.values()) >= EXAMPLES["decoder"]
    assert outcomes["accepted"] > 0 and len(outcomes) >= 8  # valid and many kinds of invalid


def test_fuzz_the_receiver(capsys: pytest.CaptureFixture[str]) -> None:
    outcomes: Counter[str] = Counter()
    inbox = guarded_inbox()
    receiver = Receiver(Identity("bob", MODEL, RUN), inbox, TENSORS, {})
    loop = asyncio.new_event_loop()

    async def stream(chunks: list[pb.StateChunk]) -> AsyncIterator[pb.StateChunk]:
        for chunk in chunks:
            yield chunk

    @settings(FUZZ, max_examples=EXAMPLES["receiver"])
    @given(push_cases())
    def one(case: tuple[list[pb.StateChunk], frozenset[str] | None]) -> None:
        chunks, peer_ids = case
        before, counted = snapshot(inbox), Counter(receiver.refusals)
        try:
            loop.run_until_complete(receiver.push(stream(chunks), peer_ids=peer_ids))
        except WireError as exc:
            assert_defined(exc)
            assert snapshot(inbox) == before
            assert receiver.refusals - counted == Counter({exc.reason: 1})
            outcomes[exc.reason.value] += 1
            return
        after = snapshot(inbox)
        new = set(after) - set(before)
        assert len(new) == 1 and all(after[k] == before[k] for k in before)
        (round_, sender), = new
        assert peer_ids is None or sender in peer_ids
        assert_valid(inbox.get(round_)[sender], {1, 2})
        assert receiver.refusals == counted
        outcomes["accepted"] += 1
        if len(after) >= 2:  # make room: most valid states are then not duplicates
            inbox.discard_before(3)

    try:
        one()
    finally:
        loop.close()
    report("receiver", outcomes, capsys)
    assert sum(outcomes.values()) >= EXAMPLES["receiver"]
    assert outcomes["accepted"] > 0 and outcomes["non-finite"] > 0
    assert outcomes["absurd-state"] > 0 and outcomes["not-authenticated"] > 0


@st.composite
def grpc_cases(draw: st.DrawFn) -> tuple[str, Any]:
    kind = draw(st.sampled_from(["push"] * 6 + ["pull", "hello"]))
    if kind == "push":
        return kind, draw(push_cases())[0]
    if kind == "pull":
        return kind, pb.PullRequest(requester=draw(senders), round=draw(rounds))
    return kind, pb.HelloRequest(
        node_id=draw(senders), protocol_version=draw(st.sampled_from([1, 1, 0, 2, 2**32 - 1])),
        model_fingerprint=draw(st.sampled_from([MODEL, MODEL, "other", ""])),
        run_fingerprint=draw(st.sampled_from([RUN, RUN, "x" * 1000])))


def test_fuzz_the_grpc_servicer(capsys: pytest.CaptureFixture[str]) -> None:
    outcomes: Counter[str] = Counter()
    inbox = guarded_inbox()
    loop = asyncio.new_event_loop()
    server = GrpcTransport(Identity("bob", MODEL, RUN), "127.0.0.1:0",
                           dict.fromkeys(MEMBERS, ""), inbox, TENSORS)
    receiver = server.receiver
    receiver.publish(RoundMessage("bob", 1, 2, payload("normal", 5)), None)

    async def setup() -> neighbor_pb2_grpc.NeighborAsyncStub:
        await server.start()
        return neighbor_pb2_grpc.NeighborStub(
            grpc.aio.insecure_channel(f"127.0.0.1:{server.port}"))

    stub = loop.run_until_complete(setup())

    async def call(kind: str, request: Any) -> None:
        if kind == "push":
            async def chunks() -> AsyncIterator[pb.StateChunk]:
                for chunk in request:
                    yield chunk
            await stub.PushState(chunks(), timeout=10)
        elif kind == "pull":
            async for _ in stub.PullState(request, timeout=10):
                pass
        else:
            await stub.Hello(request, timeout=10)

    @settings(FUZZ, max_examples=EXAMPLES["grpc"])
    @given(grpc_cases())
    # a pull of the published round: the drawn cases hold about one, timing may refuse it
    @example(("pull", pb.PullRequest(requester="alice", round=1)))
    @example(("pull", pb.PullRequest(requester="carol", round=1)))
    def one(case: tuple[str, Any]) -> None:
        kind, request = case
        before, counted = snapshot(inbox), Counter(receiver.refusals)
        try:
            loop.run_until_complete(call(kind, request))
        except grpc.aio.AioRpcError as err:
            exc = WireError(err.code().name, err.details() or "", reason_of(err))
            assert_defined(exc)
            assert snapshot(inbox) == before
            assert receiver.refusals - counted == Counter({exc.reason: 1})
            outcomes[f"{kind} {exc.reason.value}"] += 1
            return
        if kind == "push":
            after = snapshot(inbox)
            (round_, sender), = set(after) - set(before)
            assert_valid(inbox.get(round_)[sender], {1, 2})
            if len(after) >= 2:
                inbox.discard_before(3)
        assert receiver.refusals == counted
        outcomes[f"{kind} accepted"] += 1

    try:
        one()
    finally:
        loop.run_until_complete(server.stop(grace=0))
        loop.close()
    report("grpc servicer", outcomes, capsys)
    assert sum(outcomes.values()) >= EXAMPLES["grpc"]
    assert outcomes["push accepted"] > 0 and outcomes["pull accepted"] > 0
