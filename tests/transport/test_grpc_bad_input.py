"""A real gRPC server on 127.0.0.1 fed hand-made streams through raw stubs."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dacflnode._proto.dacfl.v1 import neighbor_pb2 as pb
from dacflnode._proto.dacfl.v1 import neighbor_pb2_grpc
from dacflnode.transport.base import HandshakeRefused, Identity, Inbox, PeerUnavailable
from dacflnode.transport.grpc_service import SERVICE_NAME
from dacflnode.transport.grpc_status import reason_of, unreachable, wire_error
from dacflnode.transport.grpc_transport import GrpcTransport
from dacflnode.wire.encoder import encode
from dacflnode.wire.errors import REASON_METADATA_KEY, Reason, WireError
from dacflnode.wire.message import PROTOCOL_VERSION, RoundMessage
from tests.harness import messages as harness

P = 40
TENSORS = {"omega": (P,), "x": (P,)}
MODEL, RUN = "model-fingerprint-1", "run-fingerprint-1"
LOGGER = "dacflnode.transport.receiver"


message = partial(harness.message, size=P)


def same(a: RoundMessage, b: RoundMessage) -> bool:
    return (a.sender, a.round, a.degree) == (b.sender, b.round, b.degree) and all(
        a.tensors[n].numpy().tobytes() == b.tensors[n].numpy().tobytes() for n in b.tensors
    )


class Server:
    """bob serves; alice is a well-behaved neighbour; ``stub`` talks to bob raw."""

    def __init__(self, tensors: Mapping[str, tuple[int, ...]] = TENSORS) -> None:
        self.round = 0
        self.tensors = tensors
        self.inbox = Inbox(senders={"alice", "carol"}, current_round=lambda: self.round)
        self.bob = GrpcTransport(Identity("bob", MODEL, RUN), "127.0.0.1:0",
                                 {"alice": "", "carol": ""}, self.inbox, tensors)
        self.alice: GrpcTransport
        self.channel: grpc.aio.Channel
        self.stub: neighbor_pb2_grpc.NeighborAsyncStub

    async def start(self) -> None:
        await self.bob.start()
        address = f"127.0.0.1:{self.bob.port}"
        self.alice = GrpcTransport(Identity("alice", MODEL, RUN), "127.0.0.1:0", {"bob": address},
                                   Inbox(senders={"bob"}, current_round=lambda: 0), self.tensors)
        self.channel = grpc.aio.insecure_channel(address)
        self.stub = neighbor_pb2_grpc.NeighborStub(self.channel)

    async def close(self) -> None:
        await self.channel.close()
        await self.alice.stop(grace=0)
        await self.bob.stop(grace=0)


@pytest.fixture
async def server():
    s = Server()
    await s.start()
    yield s
    await s.close()


def chunks_of(msg: RoundMessage) -> list[pb.StateChunk]:
    return list(encode(msg, chunk_bytes=64))  # header + 5 data chunks + trailer


def with_header(
    change: Callable[[pb.StateHeader], None],
) -> Callable[[RoundMessage], list[pb.StateChunk]]:
    def build(msg: RoundMessage) -> list[pb.StateChunk]:
        stream = chunks_of(msg)
        change(stream[0].header)
        return stream
    return build


def drop_tensor(h: pb.StateHeader) -> None:
    del h.tensors[1]
    h.payload_bytes = P * 4


def flip_a_bit(msg: RoundMessage) -> list[pb.StateChunk]:
    stream = chunks_of(msg)
    data = bytearray(stream[2].data)
    data[5] ^= 0x01
    stream[2] = pb.StateChunk(data=bytes(data))
    return stream


CASES = {
    "unknown sender": (with_header(lambda h: setattr(h, "sender", "mallory")),
                       grpc.StatusCode.PERMISSION_DENIED, Reason.UNKNOWN_SENDER,
                       "refused"),
    "round too far": (with_header(lambda h: setattr(h, "round", 7)),
                      grpc.StatusCode.FAILED_PRECONDITION, Reason.ROUND_AHEAD,
                      "round 7 refused"),
    "wrong shape": (with_header(lambda h: h.tensors[0].shape.__setitem__(0, P + 1)),
                    grpc.StatusCode.INVALID_ARGUMENT, Reason.BAD_PAYLOAD, "shape"),
    "wrong dtype": (with_header(lambda h: setattr(h.tensors[1], "dtype", "float64")),
                    grpc.StatusCode.INVALID_ARGUMENT, Reason.BAD_PAYLOAD, "dtype"),
    "missing tensor": (with_header(drop_tensor), grpc.StatusCode.INVALID_ARGUMENT,
                       Reason.BAD_PAYLOAD, "do not match"),
    "truncated": (lambda m: chunks_of(m)[:-1], grpc.StatusCode.DATA_LOSS, Reason.TRUNCATED,
                  "truncated"),
    "bad checksum": (flip_a_bit, grpc.StatusCode.DATA_LOSS, Reason.CHECKSUM, "checksum"),
    "data before header": (lambda m: [chunks_of(m)[1], *chunks_of(m)],
                           grpc.StatusCode.INVALID_ARGUMENT, Reason.BAD_HEADER,
                           "data before the header"),
    "too much data": (lambda m: [*chunks_of(m)[:-1], pb.StateChunk(data=b"\0" * 4),
                                 chunks_of(m)[-1]],
                      grpc.StatusCode.INVALID_ARGUMENT, Reason.BAD_PAYLOAD, "more than"),
    "no trailer": (lambda m: chunks_of(m)[:-1], grpc.StatusCode.DATA_LOSS, Reason.TRUNCATED,
                   "without its checksum trailer"),
    "early trailer": (lambda m: [*chunks_of(m)[:-2], chunks_of(m)[-1], chunks_of(m)[-2]],
                      grpc.StatusCode.DATA_LOSS, Reason.TRUNCATED, "trailer after"),
    "second trailer": (lambda m: [*chunks_of(m), chunks_of(m)[-1]],
                       grpc.StatusCode.INVALID_ARGUMENT, Reason.BAD_PAYLOAD, "second trailer"),
    "data after the trailer": (lambda m: [*chunks_of(m), pb.StateChunk(data=b"")],
                               grpc.StatusCode.INVALID_ARGUMENT, Reason.BAD_PAYLOAD,
                               "data after the trailer"),
    "wrong trailer": (lambda m: [*chunks_of(m)[:-1], pb.StateChunk(trailer=bytes(16))],
                      grpc.StatusCode.DATA_LOSS, Reason.CHECKSUM, "checksum"),
    "short trailer": (lambda m: [*chunks_of(m)[:-1], pb.StateChunk(trailer=b"x")],
                      grpc.StatusCode.INVALID_ARGUMENT, Reason.BAD_HEADER, "16 bytes"),
    "second header": (lambda m: [*chunks_of(m)[:2], chunks_of(m)[0], *chunks_of(m)[2:]],
                      grpc.StatusCode.INVALID_ARGUMENT, Reason.BAD_HEADER, "second header"),
    "empty chunk": (lambda m: [chunks_of(m)[0], pb.StateChunk(), *chunks_of(m)[1:]],
                    grpc.StatusCode.INVALID_ARGUMENT, Reason.BAD_HEADER, "empty chunk"),
    "no header": (lambda m: [], grpc.StatusCode.INVALID_ARGUMENT, Reason.BAD_HEADER,
                  "without a header"),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_a_bad_push_gets_its_status_a_log_line_and_changes_nothing(server, caplog, case):
    build, code, reason, text = CASES[case]
    first = message("alice", 0)
    await server.alice.push("bob", first, timeout=5)
    kept = server.inbox.get(0)["alice"]
    received = server.bob.stats["alice"].bytes_received
    caplog.set_level(logging.WARNING, logger=LOGGER)
    caplog.clear()

    # the bad stream claims to be carol's round-0 state: accepted, it would join `kept`
    bad = build(message("carol", 0, seed=1))

    async def stream():
        for chunk in bad:
            yield chunk

    with pytest.raises(grpc.aio.AioRpcError) as err:
        await server.stub.PushState(stream(), timeout=5)
    assert err.value.code() == code, err.value.details()
    assert reason_of(err.value) is reason
    assert text in (err.value.details() or "")
    logged = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert any(code.name in line and text in line for line in logged), logged

    assert server.inbox.get(0) == {"alice": kept}
    assert server.inbox.get(1) == {} and server.inbox.get(7) == {}
    assert server.bob.stats["alice"].bytes_received == received

    # the server still serves a correct push
    nxt = message("alice", 1)
    await server.alice.push("bob", nxt, timeout=5)
    assert same(server.inbox.get(1)["alice"], nxt)
    assert server.inbox.get(0)["alice"] is kept


async def test_bad_pulls_are_refused_and_logged(server, caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async for _ in server.stub.PullState(pb.PullRequest(requester="mallory", round=0),
                                             timeout=5):
            pass
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert reason_of(err.value) is Reason.NOT_NEIGHBOUR
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async for _ in server.stub.PullState(pb.PullRequest(requester="alice", round=3),
                                             timeout=5):
            pass
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert reason_of(err.value) is Reason.NOT_KEPT
    logged = " | ".join(r.getMessage() for r in caplog.records if r.name == LOGGER)
    assert "mallory" in logged and "round 3" in logged


async def test_hello_refusals_carry_their_status(server):
    for request, code, reason in [
        (pb.HelloRequest(node_id="mallory", protocol_version=PROTOCOL_VERSION,
                          model_fingerprint=MODEL,
                         run_fingerprint=RUN), grpc.StatusCode.PERMISSION_DENIED,
         Reason.NOT_NEIGHBOUR),
        (pb.HelloRequest(node_id="alice", protocol_version=PROTOCOL_VERSION,
                          model_fingerprint="other",
                         run_fingerprint=RUN), grpc.StatusCode.FAILED_PRECONDITION,
         Reason.MISMATCH),
    ]:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await server.stub.Hello(request, timeout=5)
        assert (err.value.code(), reason_of(err.value)) == (code, reason)
    reply = await server.stub.Hello(pb.HelloRequest(
        node_id="alice", protocol_version=PROTOCOL_VERSION, model_fingerprint=MODEL,
        run_fingerprint=RUN),
        timeout=5)
    assert reply.node_id == "bob"


async def test_an_address_served_by_another_node_is_refused(server):
    # carol's configuration says bob is at an address where dave answers
    dave = GrpcTransport(Identity("dave", MODEL, RUN), "127.0.0.1:0", {"carol": ""},
                         Inbox(senders={"carol"}, current_round=lambda: 0), TENSORS)
    await dave.start()
    carol = GrpcTransport(Identity("carol", MODEL, RUN), "127.0.0.1:0",
                          {"bob": f"127.0.0.1:{dave.port}"},
                          Inbox(senders={"bob"}, current_round=lambda: 0), TENSORS)
    try:
        with pytest.raises(HandshakeRefused, match="served by 'dave'") as err:
            await carol.hello("bob")
        assert err.value.reason is Reason.MISMATCH
    finally:
        await carol.stop(grace=0)
        await dave.stop(grace=0)


async def test_hello_to_a_server_without_the_neighbor_service_is_refused():
    other = grpc.aio.server()
    port = other.add_insecure_port("127.0.0.1:0")
    await other.start()
    carol = GrpcTransport(Identity("carol", MODEL, RUN), "127.0.0.1:0",
                          {"bob": f"127.0.0.1:{port}"},
                          Inbox(senders={"bob"}, current_round=lambda: 0), TENSORS)
    try:
        with pytest.raises(HandshakeRefused, match="does not serve") as err:
            await carol.hello("bob")
        assert err.value.reason is Reason.OTHER
    finally:
        await carol.stop(grace=0)
        await other.stop(0)


async def test_health_is_serving_until_stop():
    s = Server()
    await s.start()
    health: Any = health_pb2_grpc.HealthStub(s.channel)  # grpc_health ships no async types
    for service in ("", SERVICE_NAME):
        reply = await health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    watch = health.Watch(health_pb2.HealthCheckRequest(service=""), timeout=10)
    assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING

    stopping = asyncio.create_task(s.bob.stop(grace=5))
    assert (await watch.read()).status == health_pb2.HealthCheckResponse.NOT_SERVING
    watch.cancel()
    await asyncio.wait_for(stopping, 5)  # the last call ended: no need to wait out the grace
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    with pytest.raises(PeerUnavailable):
        await s.alice.push("bob", message("alice", 0), timeout=5)
    await s.close()


async def test_a_taken_port_is_an_error_that_names_the_address(server):
    address = f"127.0.0.1:{server.bob.port}"
    second = GrpcTransport(Identity("bob", MODEL, RUN), address, {"alice": ""},
                           Inbox(senders={"alice"}, current_round=lambda: 0), TENSORS)
    with pytest.raises(OSError, match=address):
        await second.start()
    await second.stop(grace=0)


@pytest.mark.slow
async def test_refusals_keep_their_status_when_the_sender_is_still_writing():
    # grpc/grpc#36066: a client write racing the end of the call replaces the status with
    # INTERNAL (about 1 push in 100 here without the fix); the servicer therefore reads a
    # refused stream to its end before answering
    p = 200_000
    s = Server(tensors={"omega": (p,), "x": (p,)})
    await s.start()
    s.round = 2
    stale = RoundMessage("alice", 1, 1, {"omega": torch.ones(p), "x": torch.zeros(p)})
    stream = list(encode(stale, chunk_bytes=1 << 16))  # refused at the header; 25 chunks follow
    codes: list[grpc.StatusCode] = []

    async def one() -> None:
        async def gen():
            for chunk in stream:
                yield chunk
        try:
            await s.stub.PushState(gen(), timeout=20)
        except grpc.aio.AioRpcError as err:
            codes.append(err.code())
            assert reason_of(err) is Reason.ROUND_PASSED

    logging.getLogger(LOGGER).setLevel(logging.ERROR)  # 320 refusals: keep the log quiet
    try:
        for _ in range(40):
            await asyncio.gather(*(one() for _ in range(8)))
    finally:
        logging.getLogger(LOGGER).setLevel(logging.NOTSET)
        await s.close()
    assert codes == [grpc.StatusCode.FAILED_PRECONDITION] * 320
    assert s.inbox.get(1) == {} and s.inbox.get(2) == {}


@pytest.mark.parametrize(
    ("trailing", "reason"),
    [(((REASON_METADATA_KEY, "round-passed"),), Reason.ROUND_PASSED),
     (((REASON_METADATA_KEY, "a-reason-from-a-newer-version"),), Reason.OTHER),
     ((("other-key", "round-passed"),), Reason.OTHER),
     ((), Reason.OTHER)],
    ids=["known", "unknown", "missing", "no-metadata"],
)
def test_the_client_rebuilds_the_refusal_with_a_known_reason_or_other(trailing, reason):
    err = grpc.aio.AioRpcError(grpc.StatusCode.FAILED_PRECONDITION, grpc.aio.Metadata(),
                               grpc.aio.Metadata(*trailing), details="round 1 refused")
    rebuilt = wire_error(err)
    assert isinstance(rebuilt, WireError)
    assert (rebuilt.code, rebuilt.message, rebuilt.reason) == (
        "FAILED_PRECONDITION", "round 1 refused", reason)


@pytest.mark.parametrize(
    ("code", "trailing", "retry"),
    [(grpc.StatusCode.UNAVAILABLE, (), True),
     (grpc.StatusCode.RESOURCE_EXHAUSTED, (), True),  # the server's call limit: busy
     (grpc.StatusCode.RESOURCE_EXHAUSTED, ((REASON_METADATA_KEY, "idle"),), False),
     (grpc.StatusCode.FAILED_PRECONDITION, ((REASON_METADATA_KEY, "round-passed"),), False)],
    ids=["unavailable", "call-limit", "cut-idle", "refused"],
)
def test_a_busy_server_is_retried_and_a_refusal_is_not(code, trailing, retry):
    err = grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(*trailing))
    assert unreachable(err) is retry


async def test_a_refused_push_reaches_the_caller_as_a_typed_wire_error(server):
    server.round = 3
    with pytest.raises(WireError) as err:
        await server.alice.push("bob", message("alice", 1), timeout=5)
    assert (err.value.code, err.value.reason) == ("FAILED_PRECONDITION", Reason.ROUND_PASSED)
